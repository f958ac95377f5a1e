-- lib/render.lua: the render lane of a partition: the pending entries only a consumer
-- with a browser may lease (docs/rendering.md). A render entry is one whose JSON
-- object's first field is r=1 (common/task.py: ` {"r":1`). Render entries are enqueued,
-- released, reclaimed, promoted and requeued like any into their host's queue
-- (`hq`/`hp`); the first lease.lua call that pops one moves it to its host's render
-- queue `rq:<h>` (a LIST, FIFO) instead of leasing it, without taking the host's turn
-- or slot: so a consumer without a browser never leases one. lease_render.lua leases
-- them from there, under the same host record (turn, slots, budget, group): one
-- politeness per host for both kinds.
-- `r:due` (ZSET host -> when lease_render.lua looks at the host again, ms) holds exactly
-- the hosts with entries in their render queue; `r:pending` (STRING) counts those
-- entries. They stay counted in `pending`, not in their host's queued count (which is
-- what its plain queues hold, and what `due` follows).
-- Includes nothing.

local RENDER_MARK = ' {"r":1'

-- Whether an entry (compact or full: its JSON follows its URL's first space) is a
-- render entry. A URL holds no space and compact JSON none but inside strings, where
-- a quote is escaped: the mark can only be the JSON's first field.
local function is_render(e)
  return string.find(e, RENDER_MARK, 17, true) ~= nil
end

-- Moves render entries `moved` (compact, as popped) to the tail of `host`'s render
-- queue `rq`, the host into `r:due` now (unless it is there sooner) and counts them in
-- `r:pending`. R = {due = r:due key, pending = r:pending key}.
local function render_push(R, host, rq, moved, now)
  if #moved == 0 then return end
  redis.call('RPUSH', rq, unpack(moved))
  redis.call('ZADD', R.due, 'LT', now, host)
  redis.call('INCRBY', R.pending, #moved)
end
