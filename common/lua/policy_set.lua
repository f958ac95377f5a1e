-- policy_set.lua: create or change a crawl's policy (common/frontier/policy.py): its values, a
-- version that every change bumps, and a log entry saying what changed, by whom and when,
-- in one atomic call. Values arrive validated by Python's table of policy options, as
-- text in the flags' syntax ("1s", "2"); an unchanged value is not a change, and a call
-- that changes nothing leaves the version and the log as they are.
--
-- KEYS[1]  policy      HASH  version, and one field per option: its value as text
-- KEYS[2]  policy:log  LIST  newest first, JSON {at, version, changes {key: [old, new]}, by}
-- ARGV[1] mode: create (refused when a policy exists), set (refused when none), upsert
-- ARGV[2] by: who makes the change  ARGV[3] length kept (LTRIM of policy:log)
-- ARGV[4] the version the change was made against ('' for any): a form loaded at one
--         version must not overwrite a change made since
-- ARGV[5..] pairs: option, text
-- Returns {code, version}: 0 CHANGED (the new version), 1 EXISTS (create: a policy is
--   there; its version), 2 MISSING (set: no policy; 0), 3 SAME (nothing differs; the
--   version stays), 4 MOVED (the version is not ARGV[4]; it, nothing written)
--- @include "lib/codes"

local policy, log = KEYS[1], KEYS[2]
local mode, by = ARGV[1], ARGV[2]
local keep = int_arg(ARGV[3], 'length kept')
if mode ~= 'create' and mode ~= 'set' and mode ~= 'upsert' then
  error('crawlq: policy_set mode must be create, set or upsert, got ' .. tostring(mode))
end
if #ARGV < 6 or #ARGV % 2 ~= 0 then error('crawlq: policy_set needs (option, text) pairs') end
if keep < 1 then error('crawlq: policy_set keeps at least one log entry') end
local version = tonumber(redis.call('HGET', policy, 'version'))
if mode == 'create' and version then return {1, version} end
if mode == 'set' and not version then return {2, 0} end
if ARGV[4] ~= '' and int_arg(ARGV[4], 'version') ~= (version or 0) then
  return {4, version or 0}
end
local changes, writes = {}, {}
for i = 5, #ARGV, 2 do
  local name, text = ARGV[i], ARGV[i + 1]
  if name == '' or name == 'version' or text == '' then
    error('crawlq: policy_set got an empty or reserved option: ' .. tostring(name))
  end
  local old = redis.call('HGET', policy, name)
  if old ~= text then
    changes[name] = {old or cjson.null, text}
    writes[#writes + 1] = name
    writes[#writes + 1] = text
  end
end
if #writes == 0 then return {3, version or 0} end
version = (version or 0) + 1
redis.call('HSET', policy, 'version', version, unpack(writes))
redis.call('LPUSH', log, cjson.encode({at = now_ms(), version = version, changes = changes,
                                       by = by}))
redis.call('LTRIM', log, 0, keep - 1)
return {0, version}
