"""The CPU kernels' build cache is keyed by the instruction set, not only the flag strings."""

from __future__ import annotations

from llm_inference.engine.cpu_ext import cpu_signature

ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
HASWELL = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve\n"


def test_different_instruction_sets_get_different_build_names() -> None:
    names = {cpu_signature(text) for text in (ZEN4, HASWELL, ARM)}
    assert len(names) == 3
    assert all(len(n) == 8 and int(n, 16) >= 0 for n in names)


def test_the_same_flags_in_another_order_or_core_name_the_same_build() -> None:
    reordered = ZEN4.replace("avx2 avx512f", "avx512f avx2") + "\nprocessor\t: 1\n" + ZEN4
    assert cpu_signature(reordered) == cpu_signature(ZEN4)


def test_this_machine_has_a_stable_signature() -> None:
    assert cpu_signature() == cpu_signature()
    assert cpu_signature("") == cpu_signature("model name\t: unknown\n")  # no flags: by machine
