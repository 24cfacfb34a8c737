--[[
  Phase 5, latency samples for adaptive throttling (FRONTIER_AUTOTHROTTLE_ENABLED):
  summed per site until maintenance turns them into a rate.

  Keys: lat_sum, lat_n.
  ARGV section latency: site seconds samples
    (seconds: the sum of the samples' latencies)
  Returns: nothing
]]
local Latency = {}

function Latency.run(sec)
    for e = 0, sec.n - 1 do
        local i = sec.at + e * sec.width
        redis.call('HINCRBYFLOAT', K.lat_sum, ARGV[i + sec.site], ARGV[i + sec.seconds])
        redis.call('HINCRBY', K.lat_n, ARGV[i + sec.site], ARGV[i + sec.samples])
    end
end
