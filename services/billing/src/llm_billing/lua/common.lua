-- Shared helpers, prepended to every ledger script (see keys.py for the key layout).
--
-- Lua numbers are IEEE doubles: every amount here is an integer below 2^53, which the
-- service guarantees by its limits (tokens <= 1e8, prices <= 1e12 micros per 1M tokens,
-- budgets <= 1e15 micros). Numbers always go back to Redis through fmt(), because Redis
-- would print large ones in exponent notation ("1e+15"), which HINCRBY rejects.
local MICRO = 1000000
local DAY_BALANCE_TTL_MS = 3 * 86400000    -- after the last write: late settlements
local MONTH_BALANCE_TTL_MS = 62 * 86400000 -- land in a balance that still exists

local function fmt(x)
  return string.format('%.0f', x)
end

local function num(v)
  if v then return tonumber(v) end
  return 0
end

-- The rounding rule: ceil(sum(tokens_i * price_i) / 1e6) micros, exact. Each price is
-- split as p = hi * 1e6 + lo so that no product or sum leaves the exact integer range.
local function cost(parts)
  local whole, rest = 0, 0
  for i = 1, #parts, 2 do
    local tokens, price = parts[i], parts[i + 1]
    local lo = price % MICRO
    whole = whole + tokens * ((price - lo) / MICRO)
    rest = rest + tokens * lo
  end
  local q = math.floor(rest / MICRO)
  if q * MICRO < rest then q = q + 1 end
  return whole + q
end

local function scopes(key)
  if key == '' then return {'t'} end
  return {'t', 'k:' .. key}
end

-- Adds to spent (sp) and reserved (rs) in every balance a request counts against: its
-- tenant and key, in the day, the month and all time of its admission. Day and month
-- balances expire a while after their last write, so old periods clean themselves up.
local function add_balance(base, key, day, month, d_spent, d_reserved)
  if d_spent == 0 and d_reserved == 0 then return end
  local spent, reserved = fmt(d_spent), fmt(d_reserved)
  for _, sc in ipairs(scopes(key)) do
    local prefix = base .. 'bal:' .. sc .. ':'
    local keys = {prefix .. 'd' .. day, prefix .. 'm' .. month, prefix .. 'all'}
    for i, k in ipairs(keys) do
      if d_spent ~= 0 then redis.call('HINCRBY', k, 'sp', spent) end
      if d_reserved ~= 0 then redis.call('HINCRBY', k, 'rs', reserved) end
      if i == 1 then redis.call('PEXPIRE', k, DAY_BALANCE_TTL_MS) end
      if i == 2 then redis.call('PEXPIRE', k, MONTH_BALANCE_TTL_MS) end
    end
  end
end

local METRICS = {'n', 'pt', 'ct', 'ch', 'c'}

-- Adds usage deltas {requests, prompt, completion, cached, cost} to the hour and day
-- buckets of the admission time, for the tenant, its key, the model and key x model.
local function add_usage(base, hour, day, key, model, deltas)
  local dims = {'t', 'm|' .. model}
  if key ~= '' then
    dims[3] = 'k|' .. key
    dims[4] = 'km|' .. key .. '|' .. model
  end
  for _, bucket in ipairs({base .. 'uh:' .. hour, base .. 'ud:' .. day}) do
    for i, metric in ipairs(METRICS) do
      local d = deltas[i]
      if d ~= 0 then
        local by = fmt(d)
        for _, dim in ipairs(dims) do
          redis.call('HINCRBY', bucket, metric .. '|' .. dim, by)
        end
      end
    end
  end
end

-- The usage a record has already put into the counters, by state: an expired
-- reservation was charged its worst case; reserved, released and new ones nothing.
local function charged_usage(state, prompt0, max_completion, reserved)
  if state == 'E' then return {1, prompt0, max_completion, 0, reserved} end
  return {0, 0, 0, 0, 0}
end
