--[[
  Phase 4, pauses: a site answered 429 or 503 with Retry-After, so the whole
  fleet holds off it until then; with adaptive throttling its rate halves.

  Keys: queue, throttled, rates.
  ARGV section pause: site pause_ms
  Options used: limits.adaptive, limits.min_rate, limits.start_rate
  Returns: nothing
]]
local Pause = {}

function Pause.run(sec, now, limits)
    for e = 0, sec.n - 1 do
        local i = sec.at + e * sec.width
        local site, until_ms = ARGV[i + sec.site], now + tonumber(ARGV[i + sec.pause_ms])
        redis.call('ZREM', K.queue, site)
        redis.call('ZADD', K.throttled, 'GT', until_ms, site)
        if limits.adaptive then
            local rate = tonumber(redis.call('HGET', K.rates, site) or limits.start_rate)
            redis.call('HSET', K.rates, site, math.max(limits.min_rate, rate / 2))
        end
    end
end
