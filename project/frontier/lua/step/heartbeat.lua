--[[
  Phase 3, heartbeat: this node still works on these leases; their deadline
  moves to now + lease_ms. XX: a lease that was reaped meanwhile (the node
  stalled past its deadline) is not brought back, it is someone else's now.

  Keys: inflight.
  ARGV section heartbeat: member
  Returns: nothing
]]
local Heartbeat = {}

function Heartbeat.run(sec, deadline)
    if sec.n == 0 then return end
    local args = {}
    for e = 0, sec.n - 1 do
        args[#args + 1] = deadline
        args[#args + 1] = ARGV[sec.at + e * sec.width + sec.member]
    end
    chunked('ZADD', K.inflight, args, 2, 'XX')
end
