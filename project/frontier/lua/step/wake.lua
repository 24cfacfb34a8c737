--[[
  Phase 7, wake: throttled sites whose wake time has come go back to the ready
  index. One ZRANGE when none is due, which is the common case.

  Keys: throttled, and those of lib/site_queues.lua.
  ARGV section: none.
  Returns: the first throttled entry {site, wake_ms} as read (or {}), and
           whether the throttled set changed
]]
local WAKE_BATCH = 100 -- sites woken per step; more wait a tick

local Wake = {}

function Wake.run(now)
    local first = redis.call('ZRANGE', K.throttled, 0, 0, 'WITHSCORES')
    if #first > 0 and tonumber(first[2]) <= now then
        local woken = redis.call('ZRANGEBYSCORE', K.throttled, '-inf', now, 'LIMIT', 0, WAKE_BATCH)
        chunked('ZREM', K.throttled, woken)
        for _, site in ipairs(woken) do index_site(site) end
        return first, true
    end
    return first, false
end
