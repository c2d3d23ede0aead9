-- Forget: undo a reservation that Reserve has just created for a request id owned by
-- another tenant (the id was reused across tenants). Nothing was charged yet: drop the
-- hold and the record as if the call had never happened.
-- KEYS: 1 record, 2 open reservations, 3 records by time
-- ARGV: 1 tenant base, 2 request id, 3 admitted at (ms) of the reservation to undo
-- Returns 1 when the reservation was undone, 0 when it was not there (or not ours).
local r = redis.call('HMGET', KEYS[1], 'st', 'k', 'rs', 'db', 'mb', 'at')
if r[1] ~= 'R' or r[6] ~= ARGV[3] then return 0 end
add_balance(ARGV[1], r[2], r[4], r[5], 0, -num(r[3]))
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return 1
