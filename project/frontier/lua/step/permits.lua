--[[
  Phase 3b, permits back: download permits this node holds but has no request
  for (lib/permits.lua), so other nodes may use them at once; a site at its cap
  goes back to the ready index.

  Then, with options.permit_table (each heartbeat), the node's whole table of the permits
  it holds: Redis corrects this node's counts to it. Permits Redis counts for the node
  beyond its table (granted in a step whose reply it never read) go back to the fleet;
  where the node counts more than Redis (maintenance took them back, a give-back replayed),
  the reply tells it how many it holds.

  Keys: active, capped, and those of lib/site_queues.lua.
  ARGV section give_back: site permits
  ARGV section permit_table (the node's table, after give_back): site permits
  Options used: node, permit_table
  Returns (reconcile): permits given back, {site, permits Redis counts, ...} where the
    node counts more
]]
local PermitsBack = {}

function PermitsBack.run(sec, node)
    for e = 0, sec.n - 1 do
        local i = sec.at + e * sec.width
        give_back(node, ARGV[i + sec.site], tonumber(ARGV[i + sec.permits]))
    end
end

function PermitsBack.reconcile(sec, node)
    local told, fixed, fewer = {}, 0, {}
    for e = 0, sec.n - 1 do
        local i = sec.at + e * sec.width
        told[ARGV[i + sec.site]] = tonumber(ARGV[i + sec.permits]) or 0
    end
    local held = redis.call('HGETALL', holder_key(node))
    for j = 1, #held, 2 do
        local site, counted = held[j], tonumber(held[j + 1]) or 0
        local own = told[site] or 0
        told[site] = nil
        if counted > own then
            fixed = fixed + give_back(node, site, counted - own)
        elseif counted < own then
            fewer[#fewer + 1] = site
            fewer[#fewer + 1] = counted
        end
    end
    for site, own in pairs(told) do -- sites Redis counts none of for this node
        if own > 0 then
            fewer[#fewer + 1] = site
            fewer[#fewer + 1] = 0
        end
    end
    return fixed, fewer
end
