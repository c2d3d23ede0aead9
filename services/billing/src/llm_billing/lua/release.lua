-- Release: cancel a reservation that produced no usage; refunds an expired charge.
-- KEYS: 1 record, 2 open reservations, 3 (optional) the usage outbox stream (a refunded
--       expired charge is appended to it)
-- ARGV: 1 tenant base, 2 request id, 3 now (ms)
-- Returns 1 when something was released, 0 when there was nothing to release.
local r = redis.call('HMGET', KEYS[1], 'st', 'k', 'm', 'pt0', 'mc', 'rs', 'hb', 'db', 'mb',
  'cur', 'pfrom', 'at')
local state = r[1]
if state ~= 'R' and state ~= 'E' then return 0 end
local base, key = ARGV[1], r[2]
local reserved = num(r[6])
local before = charged_usage(state, num(r[4]), num(r[5]), reserved)
if state == 'R' then
  add_balance(base, key, r[8], r[9], 0, -reserved)
else
  add_balance(base, key, r[8], r[9], -before[5], 0)
  add_usage(base, r[7], r[8], key, r[3], {-before[1], -before[2], -before[3], -before[4],
    -before[5]})
  if KEYS[3] then
    redis.call('XADD', KEYS[3], '*', 'r', ARGV[2], 'st', 'X', 'k', key, 'm', r[3], 'pt', '0',
      'ct', '0', 'ch', '0', 'c', '0', 'cur', r[10] or '', 'pf', r[11] or '0', 'at', r[12] or '0', 'sa', ARGV[3],
      'hb', r[7], 'cr', '0', 'fr', '0')
  end
end
redis.call('HSET', KEYS[1], 'st', 'X', 'xa', ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
