-- Expire: charge reservations whose TTL has passed at their reserved (worst-case) amount.
-- A later Settle corrects the charge to the actual usage; a later Release refunds it.
-- KEYS: 1 open reservations, 2 records by time, 3 (optional) the usage outbox stream
-- ARGV: 1 tenant base, 2 now (ms), 3 batch size, 4 drop records admitted before (ms)
-- Returns the number of reservations taken off the open set.
local base = ARGV[1]
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
for _, rid in ipairs(due) do
  local rec = base .. 'rec:' .. rid
  local r = redis.call('HMGET', rec, 'st', 'k', 'm', 'pt0', 'mc', 'rs', 'hb', 'db', 'mb',
    'cur', 'pfrom', 'at')
  if r[1] == 'R' then
    local reserved = num(r[6])
    add_balance(base, r[2], r[8], r[9], reserved, -reserved)
    add_usage(base, r[7], r[8], r[2], r[3], {1, num(r[4]), num(r[5]), 0, reserved})
    redis.call('HSET', rec, 'st', 'E', 'xa', ARGV[2])
    if KEYS[3] then
      redis.call('XADD', KEYS[3], '*', 'r', rid, 'st', 'E', 'k', r[2], 'm', r[3], 'pt', r[4],
        'ct', r[5], 'ch', '0', 'c', fmt(reserved), 'cur', r[10] or '', 'pf', r[11] or '0', 'at', r[12] or '0',
        'sa', ARGV[2], 'hb', r[7], 'cr', '0', 'fr', '0')
    end
  end
  redis.call('ZREM', KEYS[1], rid)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[4])
return #due
