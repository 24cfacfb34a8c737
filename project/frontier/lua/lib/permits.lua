--[[
  Download permits: what counts against a site's fleet-wide concurrency cap.

  A node holds a permit of a site for each request of that site it may download
  at once; it takes permits with the leases it downloads at once (phase lease),
  uses one per download and, when a download ends, the next request of that site
  it holds reuses it without asking Redis. A permit it has no request for goes
  back in its next step. So the cap counts downloads, not requests waiting in a
  node's heap.

  Layout:
    K.active              site -> permits held by all nodes
    <active>:<node>       site -> permits that node holds (built from K.active, so it
                          shares its hash slot when K.active carries a hash tag)
    K.holders             nodes stepping, scored by deadline (each step renews it): a
                          node that stops stepping (it died) loses its permits then
    K.capped              sites at their cap: out of the ready index until a permit
                          of theirs comes back

  Needs KEYS: active, holders, capped, and those of lib/site_queues.lua.
]]
local function holder_key(node)
    return K.active .. ':' .. node
end

-- A site at its cap goes back to the ready index once one of its permits is back.
local function uncap(site)
    if redis.call('SREM', K.capped, site) == 1 then index_site(site) end
end

-- Permits {site -> n} leave the fleet's count (their holder's own count is the caller's).
local function drop_permits(per_site)
    for site, n in pairs(per_site) do
        if redis.call('HINCRBY', K.active, site, -n) <= 0 then redis.call('HDEL', K.active, site) end
        uncap(site)
    end
end

-- A node gives back n permits of a site; at most what Redis says it holds.
local function give_back(node, site, n)
    local holder = holder_key(node)
    local held = tonumber(redis.call('HGET', holder, site) or 0)
    local back = math.min(n, held)
    if back <= 0 then return 0 end
    if held - back <= 0 then
        redis.call('HDEL', holder, site)
    else
        redis.call('HINCRBY', holder, site, -back)
    end
    drop_permits({[site] = back})
    return back
end

-- Every permit of a node goes back (it shut down, or its deadline passed).
local function give_back_all(node)
    local holder = holder_key(node)
    local held = redis.call('HGETALL', holder)
    local per_site = {}
    for j = 1, #held, 2 do per_site[held[j]] = tonumber(held[j + 1]) end
    drop_permits(per_site)
    redis.call('DEL', holder)
    redis.call('ZREM', K.holders, node)
    return #held / 2
end
