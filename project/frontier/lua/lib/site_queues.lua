--[[
  The per-site queues and the index of ready sites, shared by every script
  that puts requests back.

  Layout (every key built from the declared queue key, so when that key carries a hash
  tag, Redis Cluster, all of them live in its slot):
    <queue>                 the index of ready sites (K.queue), each scored by its best request
    <queue>|p<priority>|<site>  a list per priority of a site: its requests in arrival order
                            (RPUSH, LPOP), each packed as below
    <queue>|i|<site>        a sorted set of the site's priorities with requests, each scored
                            by its band's last score, -priority * PRIORITY_BAND +
                            PRIORITY_BAND - 1: the first is the list of the site's best
                            request (best priority; within it, FIFO is the list's own), so a
                            pop rescores nothing. A member whose list a pop emptied may stay
                            until the next pop or site_head finds the list gone
    <queue>|n               site -> requests it has had queued, of which <prefix>:leases has the
                            ones taken: queued = pushed - leased, so a pop counts nothing
                            more than the lease count it keeps anyway (lib/grants.lua); the
                            two go together (maintenance forgets an idle site's both)
    <queue>:<site>          the older layout: a sorted set of payloads scored the same way,
                            still drained (member OLDER of the site's priorities) but never
                            written
    K.throttled             sites that must wait (tokens, Retry-After), by wake time
    K.capped                sites at their concurrency cap (lib/permits.lua)

  An entry of a priority list: a form byte, the arrival (ARRIVAL_BYTES, big-endian), the
  payload's delivery id as 6 bytes when the form says so, then the payload less what the
  form rebuilds: its opening {"url":"https://<site> (or http://) and its closing
  ,"id":"<12 hex digits>"} (project/frontier/wire.py writes both). Popped, the payload is
  byte for byte the one pushed. Form byte: 'A' + 2 * url (0 none, 1 https, 2 http) + id.

  Needs KEYS: queue, throttled, capped, seq, queued.
  Needs lib/chunked.lua.
]]
local PRIORITY_BAND = 1e10   -- one priority step outweighs 10^10 arrivals
local PRIORITY_LIMIT = 100000 -- priorities are clamped so a score stays exact in a double
-- This file's internals in one table (the step script has few top-level locals to spare):
-- how an entry is packed, the keys, the older layout's adoption.
local sq = {
    -- an arrival below PRIORITY_BAND (beyond it scores overlap anyway) fits 5 bytes (2^40)
    ARRIVAL_BYTES = 5, HEADER = '>BI5', ID_HEADER = '>BI5I6', -- form, arrival(, id)
    ID_TAIL_LEN = 21, ID_TAIL_PATTERN = '^,"id":"([0-9a-f]+)"}$', -- ,"id":"<12 hex>"}
    ID_TAIL_FORMAT = ',"id":"%012x"}',
    FORM_A = 65, -- 'A'
    OLDER = 'z', -- the site's sorted set of the older layout, among its priorities
    COUNTS = K.queue .. '|n',
}

function sq.older_key(site) -- the older layout's sorted set
    return K.queue .. ':' .. site
end

function sq.index_key(site)
    return K.queue .. '|i|' .. site
end

function sq.list_key(site, priority)
    return K.queue .. '|p' .. priority .. '|' .. site
end

-- The first score of a priority's band (an index member's): a request's is that plus its
-- arrival.
local function band_of(member)
    return -tonumber(member) * PRIORITY_BAND
end

-- The score of a priority's list in a site's index (its band's last score: an older
-- layout's request of the same priority, scored by its arrival, comes first).
local function list_score(member)
    return band_of(member) + PRIORITY_BAND - 1
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

-- The openings a site's payloads usually have, which its entries leave out.
function sq.url_openings(site)
    return {'{"url":"https://' .. site, '{"url":"http://' .. site}
end

-- A payload as a priority list holds it (see the header); few strings made, it runs for
-- every request queued.
function sq.pack_entry(payload, arrival, openings)
    local form, from, to = 0, 1, #payload
    for url, opening in ipairs(openings) do
        if string.find(payload, opening, 1, true) == 1 then
            form, from = 2 * url, #opening + 1
            break
        end
    end
    if to - from >= sq.ID_TAIL_LEN - 1 then
        local hex = string.match(payload, sq.ID_TAIL_PATTERN, to - sq.ID_TAIL_LEN + 1)
        if hex and #hex == 12 then
            return struct.pack(sq.ID_HEADER, sq.FORM_A + form + 1, arrival, tonumber(hex, 16))
                .. string.sub(payload, from, to - sq.ID_TAIL_LEN)
        end
    end
    return struct.pack(sq.HEADER, sq.FORM_A + form, arrival) .. string.sub(payload, from, to)
end

-- The payload and arrival of an entry; one this file did not write is a payload of its own.
function sq.unpack_entry(entry, openings)
    local form = (string.byte(entry) or 0) - sq.FORM_A
    if form < 0 or form > 5 or #entry < 1 + sq.ARRIVAL_BYTES + 6 * (form % 2) then
        return entry, 0
    end
    local opening = openings[math.floor(form / 2)] or ''
    if form % 2 == 1 then
        local _, arrival, id, from = struct.unpack(sq.ID_HEADER, entry)
        return opening .. string.sub(entry, from) .. string.format(sq.ID_TAIL_FORMAT, id), arrival
    end
    local _, arrival, from = struct.unpack(sq.HEADER, entry)
    return opening .. string.sub(entry, from), arrival
end

-- The index member of a priority: the same text for the same number (0 for -0).
function sq.priority_member(priority)
    if priority == math.floor(priority) then return string.format('%d', priority) end
    return string.format('%.17g', priority)
end

-- A score as Redis replies it.
function sq.score_text(score)
    return string.format('%.17g', score)
end

-- The older layout's sorted set of a site joins its index (once): its best request's
-- score, or nil when it has none.
function sq.adopt_older(site)
    local head = redis.call('ZRANGE', sq.older_key(site), 0, 0, 'WITHSCORES')
    if not head[2] then return nil end
    if redis.call('ZADD', sq.index_key(site), 'NX', head[2], sq.OLDER) == 1 then
        redis.call('HINCRBY', sq.COUNTS, site, redis.call('ZCARD', sq.older_key(site)))
    end
    return head[2]
end

-- The score of the head of a site's priority list, or nil when the list is gone.
local function list_head(site, member)
    local head = redis.call('LINDEX', sq.list_key(site, member), 0)
    if not head then return nil end
    local _, arrival = sq.unpack_entry(head, sq.url_openings(site))
    return band_of(member) + arrival
end

-- The score of a site's best request, or nil when it has none; index members whose list
-- is gone leave the index. `member`: the list a pop just took from, when it may have more.
local function site_head(site, member)
    local index = sq.index_key(site)
    if member then
        local score = list_head(site, member)
        if score then return score end
        redis.call('ZREM', index, member)
    end
    while true do
        local top = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
        if not top[1] then return sq.adopt_older(site) end
        if top[1] == sq.OLDER then return top[2] end
        local score = list_head(site, top[1])
        if score then return score end
        redis.call('ZREM', index, top[1])
    end
end

-- Up to n of the older layout's requests scored below `bound` (none: any), into out.
function sq.pop_older(site, n, bound, out)
    local key, popped = sq.older_key(site), nil
    if bound then
        popped = redis.call('ZRANGE', key, '-inf', '(' .. bound, 'BYSCORE', 'LIMIT', 0, n,
                            'WITHSCORES')
        if #popped > 0 then redis.call('ZREMRANGEBYRANK', key, 0, #popped / 2 - 1) end
    else
        popped = redis.call('ZPOPMIN', key, n)
    end
    for _, value in ipairs(popped) do out[#out + 1] = value end
    local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if head[2] then
        redis.call('ZADD', sq.index_key(site), head[2], sq.OLDER)
    else
        redis.call('ZREM', sq.index_key(site), sq.OLDER)
    end
    return #popped / 2
end

-- Up to n of a priority list's requests, into out. A list that had fewer leaves the index;
-- one that had exactly n stays in it, empty, until site_head or a pop finds it gone.
function sq.pop_list(site, member, n, openings, out)
    local band = band_of(member)
    local popped = redis.call('LPOP', sq.list_key(site, member), n)
    if not popped then popped = {} end -- gone (emptied, or deleted by hand)
    for _, entry in ipairs(popped) do
        local payload, arrival = sq.unpack_entry(entry, openings)
        out[#out + 1] = payload
        out[#out + 1] = sq.score_text(band + arrival)
    end
    if #popped < n then redis.call('ZREM', sq.index_key(site), member) end
    return #popped
end

-- Take up to n of a site's best requests: {payload, score, ...}, best first, and the list
-- taken from last when it may have more (for site_head), or nil. Counting them is the
-- caller's (the lease count, lib/grants.lua).
local function site_pop(site, n)
    local out, index, openings = {}, sq.index_key(site), sq.url_openings(site)
    local taken, adopted, last = 0, false, nil
    while taken < n do
        local top = redis.call('ZRANGE', index, 0, 1, 'WITHSCORES')
        if #top == 0 then
            if adopted or not sq.adopt_older(site) then break end
            adopted = true
        elseif top[1] == sq.OLDER then
            -- its requests all came before the lists' (one arrival counter): only a worse
            -- priority's list may come between two of them
            local got = sq.pop_older(site, n - taken, top[4], out)
            taken = taken + got
            if got == 0 and top[4] then break end -- a stale score: fixed, next step goes on
        else
            -- another priority is a band apart: this list's requests all come first
            local want = n - taken
            local got = sq.pop_list(site, top[1], want, openings, out)
            taken = taken + got
            if got == want then last = top[1] end
        end
    end
    return out, last
end

-- Put a site in the ready index at its best request (out of it when it has none);
-- `member` as site_head's.
local function reindex_site(site, member)
    local head = site_head(site, member)
    if head then
        redis.call('ZADD', K.queue, head, site)
    else
        redis.call('ZREM', K.queue, site)
    end
end

-- Put a site back in the ready index at its best request, unless it must wait: throttled
-- (its wake puts it back) or at its cap (a permit coming back does, lib/permits.lua). A site
-- in the index is in neither, so a push may lower its score (push_grouped).
local function index_site(site)
    if redis.call('ZSCORE', K.throttled, site)
            or redis.call('SISMEMBER', K.capped, site) == 1 then
        return
    end
    reindex_site(site)
end

-- Add the groups of group_by_site to the site queues and the index.
local function push_grouped(by_site)
    local total = 0
    for site, grouped in pairs(by_site) do
        -- a site with no lists yet may still have the older layout's sorted set: it goes first
        if redis.call('HINCRBY', sq.COUNTS, site, grouped.n) == grouped.n then
            sq.adopt_older(site)
        end
        local index = sq.index_key(site)
        for member, list in pairs(grouped.lists) do
            local key, first = sq.list_key(site, member), 0
            for from = 1, #list, CHUNK do
                local last = math.min(#list, from + CHUNK - 1)
                local length = redis.call('RPUSH', key, unpack(list, from, last))
                if from == 1 then first = length end
            end
            -- a new list joins the index
            if first == math.min(#list, CHUNK) then
                redis.call('ZADD', index, list_score(member), member)
            end
        end
        total = total + grouped.n
        if not redis.call('ZSCORE', K.throttled, site)
                and redis.call('SISMEMBER', K.capped, site) == 0 then
            -- LT: only ever lowers a ready site's score to its new best request
            redis.call('ZADD', K.queue, 'LT', grouped.best, site)
        end
    end
    if total > 0 then redis.call('INCRBY', K.queued, total) end
end

-- Group entries {site, priority, payload} by site and priority, packed with fresh arrival
-- numbers: site -> {lists = {member -> {entry, ...}}, best, n}.
local function group_by_site(entries)
    local base = redis.call('INCRBY', K.seq, #entries) - #entries
    local by_site, openings, members = {}, {}, {}
    for j, entry in ipairs(entries) do
        local site, priority = entry[1], entry[2]
        local grouped = by_site[site]
        if not grouped then
            grouped = {lists = {}, best = nil, n = 0}
            by_site[site], openings[site] = grouped, sq.url_openings(site)
        end
        local member = members[priority]
        if not member then member = sq.priority_member(priority); members[priority] = member end
        local list = grouped.lists[member]
        local score = -priority * PRIORITY_BAND + base + j
        if not list then
            list = {}
            grouped.lists[member] = list
        end
        list[#list + 1] = sq.pack_entry(entry[3], base + j, openings[site])
        if not grouped.best or score < grouped.best then grouped.best = score end
        grouped.n = grouped.n + 1
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
