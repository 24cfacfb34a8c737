--[[
  Phase 5, latency samples for adaptive throttling (FLEET_AUTOTHROTTLE_ENABLED):
  summed per site until maintenance turns them into a rate.

  Keys: lat_sum, lat_n.
  ARGV section, LATENCY_WIDTH values each: site, seconds (sum), count
  Returns: nothing
]]
local LATENCY_WIDTH = 3

local function latency(at, count)
    for e = 0, count - 1 do
        local i = at + e * LATENCY_WIDTH
        redis.call('HINCRBYFLOAT', K.lat_sum, ARGV[i], ARGV[i + 1])
        redis.call('HINCRBY', K.lat_n, ARGV[i], ARGV[i + 2])
    end
end
