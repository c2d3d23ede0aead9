-- Settle: record a request's actual usage and release what its reservation held.
-- KEYS: 1 record, 2 open reservations, 3 records by time, 4 (optional) the usage outbox
--       stream: the final usage is appended to it in the same atomic step (see outbox.py)
-- ARGV: 1 tenant base, 2 request id, 3 prompt tokens, 4 completion tokens,
--       5 cached tokens, 6 finish reason, 7 now (ms);
--       only to record usage without a reservation: 8 key id, 9 model, 10 input price,
--       11 output price, 12 cached-input price, 13 price effective from (ms), 14 currency,
--       15 admitted at (ms), 16 hour id, 17 day id, 18 month id, 19 record retention (ms)
-- Returns {'ok', charged, currency, corrected, unreserved} | {'dup', charged, currency,
--       corrected} | {'missing'}
local rec, rid = KEYS[1], ARGV[2]
local f = {'st', 'k', 'm', 'pin', 'pout', 'pcach', 'pt0', 'mc', 'rs', 'hb', 'db', 'mb',
  'cur', 'c', 'cr', 'pfrom', 'at'}
local r = redis.call('HMGET', rec, unpack(f))
local state = r[1]
if state == 'S' then return {'dup', r[14], r[13], r[15]} end

local unreserved = '0'
if not state then
  if #ARGV < 19 then return {'missing'} end
  -- Admitted while billing was unreachable: nothing was held, record the usage now.
  redis.call('HSET', rec, 'k', ARGV[8], 'm', ARGV[9], 'pin', ARGV[10], 'pout', ARGV[11],
    'pcach', ARGV[12], 'pfrom', ARGV[13], 'cur', ARGV[14], 'at', ARGV[15], 'ex', ARGV[15],
    'hb', ARGV[16], 'db', ARGV[17], 'mb', ARGV[18], 'pt0', '0', 'mc', '0', 'rs', '0', 'sf', '0')
  redis.call('PEXPIRE', rec, ARGV[19])
  redis.call('ZADD', KEYS[3], ARGV[15], rid)
  r = redis.call('HMGET', rec, unpack(f))
  state, unreserved = 'N', '1'
end

local base, key, model = ARGV[1], r[2], r[3]
local prompt, completion, cached = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local charged = cost({prompt - cached, tonumber(r[4]), cached, tonumber(r[6]),
  completion, tonumber(r[5])})
local reserved = num(r[9])
local before = charged_usage(state, num(r[7]), num(r[8]), reserved)
local held = 0
if state == 'R' then held = reserved end

add_balance(base, key, r[11], r[12], charged - before[5], -held)
add_usage(base, r[10], r[11], key, model, {1 - before[1], prompt - before[2],
  completion - before[3], cached - before[4], charged - before[5]})
local corrected = '0'
if state == 'E' or state == 'X' then corrected = '1' end
redis.call('HSET', rec, 'st', 'S', 'pt', ARGV[3], 'ct', ARGV[4], 'ch', ARGV[5], 'fr', ARGV[6],
  'c', fmt(charged), 'sa', ARGV[7], 'cr', corrected)
redis.call('ZREM', KEYS[2], rid)
if KEYS[4] then
  redis.call('XADD', KEYS[4], '*', 'r', rid, 'st', 'S', 'k', key, 'm', model, 'pt', ARGV[3],
    'ct', ARGV[4], 'ch', ARGV[5], 'c', fmt(charged), 'cur', r[13], 'pf', r[16] or '0', 'at', r[17] or '0',
    'sa', ARGV[7], 'hb', r[10], 'cr', corrected, 'fr', ARGV[6])
end
return {'ok', fmt(charged), r[13], corrected, unreserved}
