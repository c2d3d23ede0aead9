-- Reserve: hold the worst-case cost of a request against its budgets, once per request id.
-- KEYS: 1 record, 2 open reservations, 3 records by time
-- ARGV: 1 tenant base, 2 request id, 3 key id, 4 model, 5 prompt tokens,
--       6 max completion tokens, 7 input price, 8 output price, 9 cached-input price,
--       10 price effective from (ms), 11 currency, 12 now (ms), 13 expires at (ms),
--       14 hour id, 15 day id, 16 month id (YYYYMM), 17 record retention (ms)
-- Returns {'ok', reserved, soft, budgeted} | {'dup', same args?, reserved, currency, soft, expires,
--       state}
--       | {'hard', scope, period, hard limit, used}
local rec = KEYS[1]
local old = redis.call('HMGET', rec, 'st', 'k', 'm', 'pt0', 'mc', 'rs', 'cur', 'sf', 'ex')
if old[1] then
  local same = old[2] == ARGV[3] and old[3] == ARGV[4] and old[4] == ARGV[5] and old[5] == ARGV[6]
  return {'dup', same and '1' or '0', old[6], old[7], old[8], old[9], old[1]}
end

local base, key, day, month = ARGV[1], ARGV[3], ARGV[15], ARGV[16]
local input, output, cached = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
-- Worst case: no prompt token cached (unless caching costs more), every token generated.
local amount = cost({tonumber(ARGV[5]), math.max(input, cached), tonumber(ARGV[6]), output})

local soft, budgeted = '0', '0'
local ids = {day = 'd' .. day, month = 'm' .. month, total = 'all'}
for _, sc in ipairs(scopes(key)) do
  local cfg = redis.call('HMGET', base .. 'bcfg:' .. sc, 'period', 'hard', 'soft')
  if cfg[1] then
    budgeted = '1'
    local bal = redis.call('HMGET', base .. 'bal:' .. sc .. ':' .. ids[cfg[1]], 'sp', 'rs')
    local used = num(bal[1]) + num(bal[2])
    local hard, soft_limit = num(cfg[2]), num(cfg[3])
    if hard > 0 and used + amount > hard then
      return {'hard', sc, cfg[1], fmt(hard), fmt(used), fmt(amount)}
    end
    if soft_limit > 0 and used + amount > soft_limit then soft = '1' end
  end
end

add_balance(base, key, day, month, 0, amount)
redis.call('HSET', rec, 'st', 'R', 'k', key, 'm', ARGV[4], 'pt0', ARGV[5], 'mc', ARGV[6],
  'pin', ARGV[7], 'pout', ARGV[8], 'pcach', ARGV[9], 'pfrom', ARGV[10], 'cur', ARGV[11],
  'at', ARGV[12], 'ex', ARGV[13], 'hb', ARGV[14], 'db', day, 'mb', month,
  'rs', fmt(amount), 'sf', soft)
redis.call('PEXPIRE', rec, ARGV[17])
redis.call('ZADD', KEYS[2], ARGV[13], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[12], ARGV[2])
return {'ok', fmt(amount), soft, budgeted}
