"""Lua scripts that keep a tenant's entries and their byte accounting consistent.

Every script touches the keys of one tenant only; they all share the tenant's `{tag}` hash
tag, so each runs in one Redis Cluster slot. Keys of individual entries are derived inside
the scripts from the tenant prefix (ARGV[1]), which stays within that slot.

Per tenant T (`<prefix>{<tenant tag>}:`):
  T e:<id>      hash   the entry (r = response, c = created ms, ns, v = vector, s = text)
  T sz          hash   id -> "<accounted bytes>:<model tag>"  (survives the entry's expiry)
  T lru         zset   id -> last use, ms (eviction order)
  T exp         zset   id -> expiry, ms (accounting sweep)
  T bytes       string accounted bytes of all entries
  T m:<model>   set    ids of one model (invalidation by model)
  T blk         zset   "<query digest>:<id>" -> blocked until, ms (Feedback)
"""

from __future__ import annotations

# KEYS[1..4] = sz, lru, exp, bytes; ARGV[1] = tenant prefix.
_PRELUDE = """
local T = ARGV[1]
local function drop(id)
  redis.call('DEL', T .. 'e:' .. id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  local v = redis.call('HGET', KEYS[1], id)
  if not v then return 0 end
  redis.call('HDEL', KEYS[1], id)
  local size, model = string.match(v, '^(%d+):(.*)$')
  redis.call('SREM', T .. 'm:' .. model, id)
  if redis.call('DECRBY', KEYS[4], size) < 0 then redis.call('SET', KEYS[4], 0) end
  return 1
end
local function sweep(now, limit)
  local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(ids) do drop(id) end
  return ids
end
"""

# ARGV: T, id, now, ttl_ms, size, budget, model tag, field, value, ...
# Returns {evicted ids, expired ids}.
STORE = (
    _PRELUDE
    + """
local id, now, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local size, budget, model = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local expired = sweep(now, 128)
drop(id)
local evicted = {}
local used = tonumber(redis.call('GET', KEYS[4]) or '0')
while used + size > budget do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then
    redis.call('SET', KEYS[4], 0)
    break
  end
  drop(oldest[1])
  evicted[#evicted + 1] = oldest[1]
  used = tonumber(redis.call('GET', KEYS[4]) or '0')
end
local entry = T .. 'e:' .. id
redis.call('HSET', entry, unpack(ARGV, 8))
redis.call('PEXPIRE', entry, ttl)
redis.call('HSET', KEYS[1], id, size .. ':' .. model)
redis.call('ZADD', KEYS[2], now, id)
redis.call('ZADD', KEYS[3], now + ttl, id)
redis.call('SADD', T .. 'm:' .. model, id)
redis.call('INCRBY', KEYS[4], size)
return {evicted, expired}
"""
)

# KEYS: entry, lru; ARGV: id, now. Returns {response, created, ms to expiry} or nil; marks
# the entry used.
GET_EXACT = """
local v = redis.call('HMGET', KEYS[1], 'r', 'c')
if not v[1] then return nil end
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[1])
v[3] = redis.call('PTTL', KEYS[1])
return v
"""

# KEYS: lru, blk; ARGV: T, now, query digest, candidate ids best first.
# Returns {id, response, created, missing ids, blocked ids, ms to expiry}; id '' when none
# is servable.
GET_SEMANTIC = """
local T, now, query = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local missing, blocked = {}, {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local until_ms = redis.call('ZSCORE', KEYS[2], query .. ':' .. id)
  if until_ms and tonumber(until_ms) > now then
    blocked[#blocked + 1] = id
  else
    local v = redis.call('HMGET', T .. 'e:' .. id, 'r', 'c')
    if v[1] then
      redis.call('ZADD', KEYS[1], 'XX', now, id)
      return {id, v[1], v[2], missing, blocked, redis.call('PTTL', T .. 'e:' .. id)}
    end
    missing[#missing + 1] = id
  end
end
return {'', '', '', missing, blocked, 0}
"""

# ARGV: T, ids... Returns how many of them were accounted entries.
REMOVE = (
    _PRELUDE
    + """
local removed = 0
for i = 2, #ARGV do removed = removed + drop(ARGV[i]) end
return removed
"""
)

# KEYS[5] = the model's id set; ARGV: T, batch. Returns the ids dropped (empty when done).
INVALIDATE_MODEL = (
    _PRELUDE
    + """
local ids = redis.call('SRANDMEMBER', KEYS[5], tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  drop(id)
  redis.call('SREM', KEYS[5], id)
end
return ids
"""
)

# ARGV: T, batch. Returns the ids dropped (empty when done).
INVALIDATE_TENANT = (
    _PRELUDE
    + """
local ids = redis.call('HRANDFIELD', KEYS[1], tonumber(ARGV[2]))
for _, id in ipairs(ids) do drop(id) end
return ids
"""
)

# KEYS[5] = blk; ARGV: T, id, pair member ('' = none), blocked until, now, max pairs.
# Returns 1 when a live entry was removed.
FEEDBACK = (
    _PRELUDE
    + """
local existed = redis.call('EXISTS', T .. 'e:' .. ARGV[2])
drop(ARGV[2])
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[5])
  local excess = redis.call('ZCARD', KEYS[5]) - tonumber(ARGV[6])
  if excess > 0 then redis.call('ZREMRANGEBYRANK', KEYS[5], 0, excess - 1) end
end
return existed
"""
)

# ARGV: T, now. Sweeps expired entries, returns {entries, bytes, expired ids}.
USAGE = (
    _PRELUDE
    + """
local expired = sweep(tonumber(ARGV[2]), 1000)
return {redis.call('HLEN', KEYS[1]), tonumber(redis.call('GET', KEYS[4]) or '0'), expired}
"""
)
