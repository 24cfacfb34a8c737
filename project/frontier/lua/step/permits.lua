--[[
  Phase 3b, permits back: download permits this node holds but has no request
  for (lib/permits.lua), so other nodes may use them at once; a site at its cap
  goes back to the ready index.

  Keys: active, capped, and those of lib/site_queues.lua.
  ARGV section give_back: site permits
  Options used: node
  Returns: nothing
]]
local PermitsBack = {}

function PermitsBack.run(sec, node)
    for e = 0, sec.n - 1 do
        local i = sec.at + e * sec.width
        give_back(node, ARGV[i + sec.site], tonumber(ARGV[i + sec.permits]))
    end
end
