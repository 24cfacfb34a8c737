--[[
  Phase 3b, permits back: download permits this node holds but has no request
  for (lib/permits.lua), so other nodes may use them at once; a site at its cap
  goes back to the ready index.

  Keys: active, capped, and those of lib/site_queues.lua.
  ARGV section, GIVE_BACK_WIDTH values each: site, permits
  Options used: node
  Returns: nothing
]]
local GIVE_BACK_WIDTH = 2

local function permits_back(at, count, node)
    for e = 0, count - 1 do
        give_back(node, ARGV[at + e * GIVE_BACK_WIDTH], tonumber(ARGV[at + e * GIVE_BACK_WIDTH + 1]))
    end
end
