--[[
  Phase 3, heartbeat: this node still works on these leases; their deadline
  moves to now + lease_ms. XX: a lease that was reaped meanwhile (the node
  stalled past its deadline) is not brought back, it is someone else's now.

  Keys: inflight.
  ARGV section, HEARTBEAT_WIDTH values each: member
  Returns: nothing
]]
local HEARTBEAT_WIDTH = 1

local function heartbeat(at, count, deadline)
    if count == 0 then return end
    local args = {}
    for e = 0, count - 1 do
        args[#args + 1] = deadline
        args[#args + 1] = ARGV[at + e]
    end
    chunked('ZADD', K.inflight, args, 2, 'XX')
end
