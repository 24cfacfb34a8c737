--[[
  The per-site queues and the index of ready sites, shared by every script
  that puts requests back.

  Layout:
    <queue>                 the index of ready sites (K.queue), each scored by its best request
    <queue>:<site>          one site's requests, scored -priority * PRIORITY_BAND + arrival,
                            so the best priority comes first and equal priorities FIFO; built
                            from the declared queue key, so when that key carries a hash tag
                            (Redis Cluster) every site queue lives in its slot
    K.throttled             sites that must wait (tokens, Retry-After), by wake time
    K.capped                sites at their concurrency cap (lib/permits.lua)

  Needs KEYS: queue, throttled, capped, seq, queued. Needs lib/chunked.lua.
]]
local PRIORITY_BAND = 1e10   -- one priority step outweighs 10^10 arrivals
local PRIORITY_LIMIT = 100000 -- priorities are clamped so a score stays exact in a double

local function site_key(site)
    return K.queue .. ':' .. site
end

local function clamp_priority(priority)
    if priority ~= priority then return 0 end -- NaN (cjson reads it): no score at all
    if priority > PRIORITY_LIMIT then return PRIORITY_LIMIT end
    if priority < -PRIORITY_LIMIT then return -PRIORITY_LIMIT end
    return priority
end

-- The priority inside a payload that goes back to the queue (0 if it has none).
local function priority_of(payload)
    local ok, doc = pcall(cjson.decode, payload)
    if ok and type(doc) == 'table' and type(doc['priority']) == 'number' then
        return clamp_priority(doc['priority'])
    end
    return 0
end

-- The score of a site's best request, or nil when it has none.
local function site_head(site)
    local head = redis.call('ZRANGE', site_key(site), 0, 0, 'WITHSCORES')
    return head[2]
end

-- Whether a site has requests queued.
local function site_has(site)
    return redis.call('EXISTS', site_key(site)) == 1
end

-- Requests a site has queued.
local function site_size(site)
    return redis.call('ZCARD', site_key(site))
end

-- Take up to n of a site's best requests: {payload, score, ...}, best first.
local function site_pop(site, n)
    return redis.call('ZPOPMIN', site_key(site), n)
end

-- Put a site in the ready index at its best request (out of it when it has none).
local function reindex_site(site)
    local head = site_head(site)
    if head then
        redis.call('ZADD', K.queue, head, site)
    else
        redis.call('ZREM', K.queue, site)
    end
end

-- Put a site back in the ready index at its best request, unless it is throttled.
local function index_site(site)
    if redis.call('ZSCORE', K.throttled, site) then return end
    reindex_site(site)
end

-- Add {site -> {score, payload, ...}} (best score first) to the site queues and the index.
local function push_grouped(by_site)
    local total = 0
    for site, args in pairs(by_site) do
        total = total + chunked('ZADD', site_key(site), args, 2)
        if not redis.call('ZSCORE', K.throttled, site)
                and redis.call('SISMEMBER', K.capped, site) == 0 then
            -- LT: only ever lowers a ready site's score to its new best request
            redis.call('ZADD', K.queue, 'LT', args[1], site)
        end
    end
    if total > 0 then redis.call('INCRBY', K.queued, total) end
end

-- Group entries {site, priority, payload} by site with fresh arrival numbers.
local function group_by_site(entries)
    local base = redis.call('INCRBY', K.seq, #entries) - #entries
    local by_site = {}
    for j, entry in ipairs(entries) do
        local site = entry[1]
        local args = by_site[site]
        if not args then args = {}; by_site[site] = args end
        local score = -entry[2] * PRIORITY_BAND + base + j
        if #args > 0 and score < args[1] then
            table.insert(args, 1, entry[3]); table.insert(args, 1, score)
        else
            args[#args + 1] = score; args[#args + 1] = entry[3]
        end
    end
    return by_site
end

-- Requests {site, payload} that go back to the queue: fresh arrival numbers, same priority.
local function push_payloads(items)
    if #items == 0 then return end
    local entries = {}
    for j, item in ipairs(items) do
        entries[j] = {item[1], priority_of(item[2]), item[2]}
    end
    push_grouped(group_by_site(entries))
end

-- "<site>\n<payload>" -> site, payload
local function split_site(text)
    local nl = string.find(text, '\n', 1, true)
    if not nl then return '_', text end
    return string.sub(text, 1, nl - 1), string.sub(text, nl + 1)
end
