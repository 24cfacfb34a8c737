--[[
  Phase 11, release (a node that closes, lua/release.lua's work in the step): the leases
  it holds but never started go back to the queue, and every download permit it holds to
  the fleet, after this step settled what it finished, so a clean stop hands everything
  back in the round trip that settles it. A member no longer held (reaped meanwhile) is
  skipped.

  Keys: inflight, active, queue, throttled, seq, queued, start_urls, capped, holders.
  ARGV section release: member
  Returns: the leases that went back
]]
local Release = {}

function Release.run(sec, on, node)
    if not on then return 0 end
    give_back_all(node)
    local held = {}
    for e = 0, sec.n - 1 do
        local member = ARGV[sec.at + e * sec.width + sec.member]
        if redis.call('ZREM', K.inflight, member) == 1 then held[#held + 1] = member end
    end
    if #held == 0 then return 0 end
    return put_back(held)
end
