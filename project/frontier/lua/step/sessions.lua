--[[
  Phase 6b, sessions: what this node's downloads told of the fleet's sessions and proxies
  (project/blocking/pool.py), then the sessions of the sites it asks about. A session
  retired here (too many blocks, uses or years) is gone for every node from this step on;
  a (proxy, site) pair that is banned cools down for the fleet, and its sessions retire.

  Keys: sessions, proxies.
    sessions        "<site>\n<id>" -> {p = proxy, ua, u = uses, e = error score, b = born ms,
                    c = cookie jar}; sessions|<site>: the ids alive; sessions:v: site -> the
                    version of its sessions (any change bumps it); sessions:n: site -> its
                    sessions alive (for status; none: absent); sessions:retired:
                    "<site>\n<id>" scored by when it retired (the newest 1000), and
                    sessions:retired:last: its last state; sessions:seen: site -> when a
                    node last told of it (maintenance forgets sites idle long)
    proxies         "<proxy>\n<site>" -> {s = score, t = ms of s, n = bans, untl = ms its
                    cool-down ends, ok, bl = blocks, pv = 1 once it served a page};
                    proxies|<site>: the proxies with a record for the site;
                    proxies:sites: the sites with a record
  ARGV section session: kind site id proxy data
    kind 'new'    a session this node made; data: JSON {ua = ...}. Kept while the site has
                  fewer than options.sessions.size alive and no session of that id retired
                  (else the node drops it)
    kind 'pin'    a session a request named (meta["session"]): kept whatever the size
    kind 'ok'     a download through it was no block; data: its cookie jar (JSON) when it
                  changed, else ''
    kind 'block'  a download through it was blocked; data: a jitter in [0, 1) for the
                  pair's cool-down (equal jitter: the node draws it)
  Options used: sessions = {size, max_errors, max_uses, max_age_ms, ban_score, half_life_ms,
                cool_base_ms, cool_max_ms, sites = {site = version the node knows, ...},
                probes = {"<site>\n<proxy>", ...}, release = {...}, probe_ms}: probes
                are the pairs on probation (no page served yet, or blocked since) this
                node would try; one node of the fleet at a time may
                (proxies:probe:<site>\n<proxy>, for probe_ms or until the pair's next
                report), so a banned pair costs the fleet one request, however many nodes
                it has; release: the probes this node holds and no longer wants
  Returns: {site, version, sessions, proxies, ...}: for each site of options.sessions.sites
           whose version is not the one the node knows, its sessions alive (JSON list of
           {id, p, ua, u, e, c}) and its pairs (JSON {proxy = {untl, s, pv}}); the
           number of sessions this step retired; and the probes this node holds
           ({"<site>\n<proxy>", ...})
]]
local Sessions = {}

do
    local RETIRED_KEPT = 1000
    -- sessions a site keeps alive whatever SESSION_POOL_SIZE, pinned (meta["session"]) ones
    -- included: ids a spider may take from pages are not kept without end
    local MOST_ALIVE = 1000
    -- sites one maintenance forgets at most
    local FORGET_SITES = 20

    local function alive_key(site) return K.sessions .. '|' .. site end
    local function pairs_key(site) return K.proxies .. '|' .. site end

    -- a change to the site's sessions or pairs: the nodes hear of it by the version, and
    -- status reads the count alive from one hash
    local function bump(site)
        -- the version is Redis' time (or one more): a site forgotten and made again never
        -- comes back at a version a node still knows
        local version = tonumber(redis.call('HGET', K.sessions .. ':v', site) or 0)
        redis.call('HSET', K.sessions .. ':v', site, math.max(now_ms(), version + 1))
        local alive = redis.call('SCARD', alive_key(site))
        if alive > 0 then
            redis.call('HSET', K.sessions .. ':n', site, alive)
        else
            redis.call('HDEL', K.sessions .. ':n', site)
        end
    end

    local function retire(site, id, now)
        local field = site .. '\n' .. id
        local last = redis.call('HGET', K.sessions, field)
        if not last then return 0 end
        redis.call('HDEL', K.sessions, field)
        redis.call('SREM', alive_key(site), id)
        redis.call('ZADD', K.sessions .. ':retired', now, field)
        redis.call('HSET', K.sessions .. ':retired:last', field, last)
        bump(site)
        return 1
    end

    local function decayed(pair, now, half_life)
        local s = pair.s or 0
        if s > 0 and half_life > 0 and pair.t then
            s = s * math.pow(0.5, math.max(0, now - pair.t) / half_life)
        end
        return s
    end

    -- a block or a page through (proxy, site): its score, and a cool-down once banned.
    -- Returns whether it was banned now, and whether the nodes' view of it changed.
    local function count_pair(proxy, site, blocked, jitter, now, o, node)
        local field = proxy .. '\n' .. site
        local raw = redis.call('HGET', K.proxies, field)
        local pair = raw and cjson.decode(raw) or {n = 0, ok = 0, bl = 0, pv = 0, untl = 0}
        if not raw then
            redis.call('SADD', pairs_key(site), proxy)
            redis.call('SADD', K.proxies .. ':sites', site)
        end
        pair.s, pair.t = decayed(pair, now, o.half_life_ms), now
        local banned = false
        -- the probe's answer ends it (another node's probe of the pair stays its own)
        local probe = K.proxies .. ':probe:' .. site .. '\n' .. proxy
        if redis.call('GET', probe) == node then redis.call('DEL', probe) end
        if blocked then
            pair.bl = pair.bl + 1
            pair.s = pair.s + 1
            -- unproven, one block bans it; a pair that served pages, ban_score of them, and
            -- it is on probation again meanwhile (pv 0: one node of the fleet tries it)
            local was_proven = pair.pv == 1
            pair.pv = 0
            if (not was_proven or pair.s >= o.ban_score) and (pair.untl or 0) <= now then
                pair.n = pair.n + 1
                -- equal jitter: at least half the ceiling (a pair banned again at once would
                -- cost the fleet a probe each time), 300-600 s after a first ban by default
                local ceiling = math.min(o.cool_max_ms, o.cool_base_ms * math.pow(2, pair.n))
                pair.untl = now + math.floor((0.5 + jitter / 2) * ceiling)
                pair.s = 0
                banned = true
            end
        end
        local proven = false
        if not blocked then
            pair.ok = pair.ok + 1
            -- a page fetched before the ban and told after it proves nothing of the pair now
            if (pair.untl or 0) <= now then
                proven = pair.pv == 0
                pair.pv = 1
            end
        end
        redis.call('HSET', K.proxies, field, cjson.encode(pair))
        return banned, banned or proven or blocked or not raw
    end

    -- the probes of options.sessions.probes this node may make: one node at a time a pair
    local function probes(o, node)
        for _, pair in ipairs(o.release or {}) do
            local key = K.proxies .. ':probe:' .. pair
            if redis.call('GET', key) == node then redis.call('DEL', key) end
        end
        local held = {}
        for _, pair in ipairs(o.probes or {}) do
            local key = K.proxies .. ':probe:' .. pair
            if redis.call('SET', key, node, 'NX', 'PX', o.probe_ms) then
                held[#held + 1] = pair
            elseif redis.call('GET', key) == node then
                redis.call('PEXPIRE', key, o.probe_ms)
                held[#held + 1] = pair
            end
        end
        return held
    end

    -- the sessions of *site* through *proxy* retire with their pair's ban
    local function retire_through(site, proxy, now)
        local retired = 0
        for _, id in ipairs(redis.call('SMEMBERS', alive_key(site))) do
            local raw = redis.call('HGET', K.sessions, site .. '\n' .. id)
            if raw and cjson.decode(raw).p == proxy then
                retired = retired + retire(site, id, now)
            end
        end
        return retired
    end

    local function worn(s, now, o)
        return s.e >= o.max_errors or s.u >= o.max_uses or now - s.b >= o.max_age_ms
    end

    function Sessions.run(sec, now, o, node)
        if not o then return {}, 0, {} end
        local retired, told = 0, {}
        for e = 0, sec.n - 1 do
            local i = sec.at + e * sec.width
            local kind, site, id = ARGV[i + sec.kind], ARGV[i + sec.site], ARGV[i + sec.id]
            told[site] = true
            local proxy, data = ARGV[i + sec.proxy], ARGV[i + sec.data]
            local field = site .. '\n' .. id
            if kind == 'new' or kind == 'pin' then
                if redis.call('HEXISTS', K.sessions, field) == 0
                        and not redis.call('ZSCORE', K.sessions .. ':retired', field)
                        and redis.call('SCARD', alive_key(site))
                            < (kind == 'pin' and MOST_ALIVE or math.min(o.size, MOST_ALIVE)) then
                    local ok, given = pcall(cjson.decode, data)
                    local ua = ok and type(given) == 'table' and tonumber(given.ua) or 0
                    redis.call('HSET', K.sessions, field, cjson.encode(
                        {p = proxy, ua = ua, u = 0, e = 0, b = now, c = ''}))
                    redis.call('SADD', alive_key(site), id)
                    bump(site)
                end
            else
                local blocked = kind == 'block'
                local banned, changed = count_pair(proxy, site, blocked, tonumber(data) or 0, now,
                                                   o, node)
                if banned then retired = retired + retire_through(site, proxy, now) end
                if changed then bump(site) end
                local raw = id ~= '' and redis.call('HGET', K.sessions, field)
                if raw then
                    local s = cjson.decode(raw)
                    s.u = s.u + 1
                    if blocked then
                        s.e = s.e + 1
                    else
                        s.e = math.max(0, s.e - 0.5)
                        if data ~= '' then s.c = data; bump(site) end
                    end
                    redis.call('HSET', K.sessions, field, cjson.encode(s))
                    if worn(s, now, o) then retired = retired + retire(site, id, now) end
                end
            end
        end
        for site in pairs(told) do redis.call('ZADD', K.sessions .. ':seen', now, site) end
        if retired > 0 then
            local old = redis.call('ZRANGE', K.sessions .. ':retired', 0, -RETIRED_KEPT - 1)
            if #old > 0 then
                redis.call('ZREMRANGEBYRANK', K.sessions .. ':retired', 0, #old - 1)
                chunked('HDEL', K.sessions .. ':retired:last', old)
            end
        end
        local reply = {}
        for site, known in pairs(o.sites or {}) do
            -- sessions that aged out since they were last used retire as they are asked for
            for _, id in ipairs(redis.call('SMEMBERS', alive_key(site))) do
                local raw = redis.call('HGET', K.sessions, site .. '\n' .. id)
                if not raw then
                    redis.call('SREM', alive_key(site), id)
                    bump(site)
                elseif now - cjson.decode(raw).b >= o.max_age_ms then
                    retired = retired + retire(site, id, now)
                end
            end
            local version = tonumber(redis.call('HGET', K.sessions .. ':v', site) or 0)
            if version ~= tonumber(known) then
                local list = {}
                for _, id in ipairs(redis.call('SMEMBERS', alive_key(site))) do
                    local s = cjson.decode(redis.call('HGET', K.sessions, site .. '\n' .. id))
                    list[#list + 1] = {id = id, p = s.p, ua = s.ua, u = s.u, e = s.e, c = s.c}
                end
                local health = {}
                for _, proxy in ipairs(redis.call('SMEMBERS', pairs_key(site))) do
                    local raw = redis.call('HGET', K.proxies, proxy .. '\n' .. site)
                    if raw then
                        local pair = cjson.decode(raw)
                        health[proxy] = {untl = pair.untl or 0, s = decayed(pair, now,
                                         o.half_life_ms), pv = pair.pv}
                    end
                end
                reply[#reply + 1] = site
                reply[#reply + 1] = version
                reply[#reply + 1] = #list > 0 and cjson.encode(list) or '[]'
                reply[#reply + 1] = next(health) and cjson.encode(health) or '{}'
            end
        end
        return reply, retired, probes(o, node)
    end

    -- Maintenance: what the fleet keeps of sites no node told of for twice the longer of a
    -- session's life and a cool-down's ceiling goes (their sessions aged out, their bans
    -- ended), FORGET_SITES at a time. Returns how many sites were forgotten.
    function Sessions.forget(now, o)
        if not o then return 0 end
        local idle_ms = 2 * math.max(o.max_age_ms, o.cool_max_ms)
        local sites = redis.call('ZRANGEBYSCORE', K.sessions .. ':seen', '-inf', now - idle_ms,
                                 'LIMIT', 0, FORGET_SITES)
        for _, site in ipairs(sites) do
            local fields = {}
            for _, id in ipairs(redis.call('SMEMBERS', alive_key(site))) do
                fields[#fields + 1] = site .. '\n' .. id
            end
            chunked('HDEL', K.sessions, fields)
            fields = {}
            for _, proxy in ipairs(redis.call('SMEMBERS', pairs_key(site))) do
                fields[#fields + 1] = proxy .. '\n' .. site
            end
            chunked('HDEL', K.proxies, fields)
            redis.call('DEL', alive_key(site), pairs_key(site))
            redis.call('SREM', K.proxies .. ':sites', site)
            redis.call('HDEL', K.sessions .. ':n', site)
            bump(site)
            redis.call('ZREM', K.sessions .. ':seen', site)
        end
        return #sites
    end
end
