"""Credential-like query parameters removed at the edge before anything reads the request
(issue 32, finding 4).

The access logs drop the query string whole (`filters.PATH_WITHOUT_QUERY`), but the path is
also read by auth's HTTP check, the router, and Envoy's trace spans (`http.url` is the full
URL; a custom tag cannot replace it, and header_mutation may not rewrite `:path`). A Lua
filter, first in the edge's chain, rewrites `:path` without the parameters whose name,
percent-decoded, lower-cased and stripped of separators, contains one of SENSITIVE_WORDS
(`api_key`, `API%5FKey`, `x-auth-token`, `Signature`, ...); other parameters stay. Requests
without a query string return at the first check.
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]
LUA = "envoy.filters.http.lua"
SENSITIVE_WORDS = (
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "auth",
    "signature",
    "credential",
    "session",
    "jwt",
)

_CODE = """
local WORDS = {%(words)s}

local function sensitive(name)
  local decoded = string.gsub(name, "%%%%(%%x%%x)", function(hex)
    return string.char(tonumber(hex, 16))
  end)
  local plain = string.gsub(string.lower(decoded), "[^a-z0-9]", "")
  for _, word in ipairs(WORDS) do
    if string.find(plain, word, 1, true) then
      return true
    end
  end
  return false
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local path = headers:get(":path")
  local mark = path and string.find(path, "?", 1, true)
  if not mark then
    return
  end
  local kept = {}
  for pair in string.gmatch(string.sub(path, mark + 1), "[^&;]+") do
    if not sensitive(string.match(pair, "^[^=]*")) then
      kept[#kept + 1] = pair
    end
  end
  local base = string.sub(path, 1, mark - 1)
  if #kept == 0 then
    headers:replace(":path", base)
  else
    headers:replace(":path", base .. "?" .. table.concat(kept, "&"))
  end
end
"""


def lua_code() -> str:
    words = ", ".join(f'"{w}"' for w in SENSITIVE_WORDS)
    return _CODE % {"words": words}


def query_scrub_filter() -> Config:
    return {
        "name": LUA,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": lua_code()},
            "stat_prefix": "edge_query_scrub",
        },
    }
