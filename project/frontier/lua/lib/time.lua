--[[
  now_ms(): the current time in milliseconds by Redis' clock.

  Every node reads time from the one server, so leases, retries and pauses
  mean the same thing on every machine however far their clocks drift.
]]
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
