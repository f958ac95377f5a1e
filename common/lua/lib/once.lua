-- lib/once.lua: a call sent again after its outcome was unknown (its reply lost, or no
-- answer in time) is told by its operation id, so a script whose second run would count
-- twice runs once (common/resend.py classifies every script). The id is 16 hex digits
-- chosen by the caller, the same for every send of one call ('' for none).
--
-- A worker keeps, per partition, its last ONCE_KEPT calls' ids with what each kept (its
-- reply, or true when the script rebuilds its reply itself) in one STRING,
-- ops:<worker> (cmsgpack: {id, kept, id, kept, ...}, oldest first), for ONCE_KEEP_MS
-- after its last call: a call sent again finds its first run there and answers from it,
-- changing nothing more. Includes nothing; the key comes in KEYS.
local ONCE_KEPT = 16
local ONCE_KEEP_MS = 60000

-- "<worker> <op id>" (ack, fail) as the worker and the op id ('' when there is none).
local function once_split(arg)
  local worker, op = string.match(arg, '^(%S+) (%x+)$')
  if worker then return worker, op end
  return arg, ''
end

-- What call `op` kept in `key` when it ran before (nil for a first run), and the calls
-- kept there (for once_keep).
local function once_kept(key, op)
  if op == '' then return nil, {} end
  local raw = redis.call('GET', key)
  local calls = raw and cmsgpack.unpack(raw) or {}
  for i = 1, #calls - 1, 2 do
    if calls[i] == op then return calls[i + 1], calls end
  end
  return nil, calls
end

-- Remember call `op` with `reply` (what a call sent again answers, or true) among
-- `calls` (once_kept's), the oldest dropped past ONCE_KEPT.
local function once_keep(key, op, reply, calls)
  if op == '' then return end
  local out = {}
  for i = math.max(1, #calls - 2 * (ONCE_KEPT - 1) + 1), #calls do out[#out + 1] = calls[i] end
  out[#out + 1] = op
  out[#out + 1] = reply
  redis.call('SET', key, cmsgpack.pack(out), 'PX', ONCE_KEEP_MS)
end
