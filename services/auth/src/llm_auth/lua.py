"""Lua scripts for the limiter: token buckets, reservations and concurrency leases.

Every script reads the clock with Redis TIME, so all replicas share one clock, and runs
atomically, so concurrent callers on any number of replicas can never over-admit.
Bucket state is a hash {t: tokens (float), ts: last update (µs)}; a missing bucket is full.
"""

from __future__ import annotations

# Shared helpers. ARGV pairs (limit, period µs) describe KEYS[first..] in order.
_BUCKETS = """
local EPS = 1e-9
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function refill(key, limit, period, now)
  local s = redis.call('HMGET', key, 't', 'ts')
  local tokens, ts = tonumber(s[1]), tonumber(s[2])
  if tokens == nil or ts == nil then return limit, now end
  if now > ts then tokens = tokens + (now - ts) * limit / period else now = ts end
  if tokens > limit then tokens = limit end
  return tokens, now
end
local function save(key, tokens, ts, limit, period)
  redis.call('HSET', key, 't', string.format('%.17g', tokens), 'ts', string.format('%.17g', ts))
  -- Once full again the state says nothing a missing key would not: let it expire then.
  redis.call('PEXPIRE', key, math.ceil((limit - tokens) * period / limit / 1000) + 1000)
end
local function buckets(first, argv_first)
  local list = {}
  for i = first, #KEYS do
    local a = argv_first + 2 * (i - first)
    table.insert(list, {key = KEYS[i], limit = tonumber(ARGV[a]), period = tonumber(ARGV[a + 1])})
  end
  return list
end
-- Charge `cost` to every bucket or to none. cost 0 checks that one unit would fit.
-- Reply: {allowed, impossible, retry_after_us, remaining_1, reset_after_us_1, ...}
local function take(list, cost, now)
  local need = cost
  if need == 0 then need = 1 end
  local allowed, impossible, retry = 1, 0, 0
  for _, b in ipairs(list) do
    b.tokens, b.ts = refill(b.key, b.limit, b.period, now)
    if need > b.limit then
      allowed, impossible = 0, 1
    elseif b.tokens + EPS < need then
      allowed = 0
      retry = math.max(retry, (need - b.tokens) * b.period / b.limit)
    end
  end
  if allowed == 1 and cost > 0 then
    for _, b in ipairs(list) do
      b.tokens = b.tokens - cost
      save(b.key, b.tokens, b.ts, b.limit, b.period)
    end
  end
  local reply = {allowed, impossible, math.ceil(retry)}
  for _, b in ipairs(list) do
    table.insert(reply, math.max(0, math.floor(b.tokens + EPS)))
    table.insert(reply, math.ceil((b.limit - b.tokens) * b.period / b.limit))
  end
  return reply
end
"""

# KEYS: buckets. ARGV: cost, then (limit, period) per bucket.
HIT = (
    _BUCKETS
    + """
return take(buckets(1, 2), tonumber(ARGV[1]), now_us())
"""
)

# KEYS[1]: reservation; KEYS[2..]: buckets. ARGV: cost, reservation ttl ms, (limit, period)...
# A repeated reservation id charges nothing and reports the state (duplicate flag 1).
RESERVE = (
    _BUCKETS
    + """
local list = buckets(2, 3)
local now = now_us()
if redis.call('EXISTS', KEYS[1]) == 1 then
  local reply = take(list, 0, now)
  reply[1], reply[2], reply[3] = 1, 0, 0
  table.insert(reply, 1, 1)
  return reply
end
local reply = take(list, tonumber(ARGV[1]), now)
if reply[1] == 1 then
  redis.call('HSET', KEYS[1], 'tokens', ARGV[1], 'refunded', '0')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
table.insert(reply, 1, 0)
return reply
"""
)

# KEYS[1]: reservation; KEYS[2..]: buckets. ARGV: tokens to refund, (limit, period)...
# Reply: {status, remaining_1, ...}: 1 refunded, 0 already refunded (nothing more),
# -1 unknown or expired reservation, -2 more than was reserved (reply[2] = reserved).
REFUND = (
    _BUCKETS
    + """
local r = redis.call('HMGET', KEYS[1], 'tokens', 'refunded')
if not r[1] then return {-1} end
local reserved, refund = tonumber(r[1]), tonumber(ARGV[1])
local list = buckets(2, 2)
local now = now_us()
local status = 0
if r[2] == '0' then
  if refund > reserved then return {-2, reserved} end
  status = 1
  redis.call('HSET', KEYS[1], 'refunded', '1', 'refund', ARGV[1])
end
local reply = {status}
for _, b in ipairs(list) do
  b.tokens, b.ts = refill(b.key, b.limit, b.period, now)
  if status == 1 and refund > 0 then
    b.tokens = math.min(b.limit, b.tokens + refund)
    save(b.key, b.tokens, b.ts, b.limit, b.period)
  end
  table.insert(reply, math.max(0, math.floor(b.tokens + EPS)))
end
return reply
"""
)

# KEYS[1]: the key's leases (zset lease id -> expiry ms). ARGV: limit (0 = none), lease, ttl ms.
# Reply: {acquired, in_use, retry_after_ms, expires_at_ms}. Re-acquiring a held lease renews it.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, lease, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], lease)
local count = redis.call('ZCARD', KEYS[1])
if not held and limit > 0 and count >= limit then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, count, tonumber(first[2]) - now, 0}
end
redis.call('ZADD', KEYS[1], now + ttl, lease)
if not held then count = count + 1 end
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, count, 0, now + ttl}
"""

# KEYS[1]: the key's leases. ARGV: lease. Reply 1 when a live lease was released.
RELEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(expiry) <= now then return 0 end
return 1
"""
