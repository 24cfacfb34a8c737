--[[
  Revisits (FRONTIER_REVISIT, project/frontier/revisit.py): what the last fetch of each URL
  under a revisit policy left for the next one, and when that next one is due. Only such
  URLs have an entry; the seen-set itself holds no more than it did.

  Keys: revisit  fingerprint -> "<interval ms>\n<run>\n<site>\n<priority>\n<record>\n<payload>"
                 (run: the crawl run of that fetch, lua/run_join.lua)
        <revisit>:sites  site -> its records (FRONTIER_REVISIT_MAX_SITE_URLS caps it)
        <revisit>:missed fingerprint -> "<runs>:<since ms>": runs in a row that ended without
                 rediscovering it (the sweep fetched it), since when; more than
                 FRONTIER_REVISIT_FORGET_RUNS of them over FRONTIER_REVISIT_FORGET_AFTER and it
                 is forgotten
        due      fingerprint, scored by when its URL may be fetched again (ms, Redis clock)
        runs     the current crawl run
  ARGV section revisit (after settle): fingerprint interval_ms record
    interval_ms  0: no longer under a policy: forget it
    record       "<site>\n<priority>\n<record>\n<payload>", record: the JSON the node wants
                 back with the revisit (validators, content hash, items)
  Options used: revisit_limits {records in all, records of a site, runs a record may miss,
                 ms it may miss them over}
  Revisit.record(sec, now): keeps what each fetched URL left for its revisit, a new URL only
    within the caps; returns how many new ones the caps left out.
  Revisit.due(fp, payload, now): the payload to queue when a seen URL is rediscovered, its
    revisit is due and its last fetch was in another crawl run (a page is fetched once per
    crawl, however short its interval), with the record added as its "revisit" field; else
    nil. It is then due again one interval later, so a lost revisit comes back. The first
    rediscovery in a run of a URL not due yet returns nil and its record: the node keeps that
    page's items alive.
  Revisit.seeded(fp): a seed (or start request) queued in this run: its URL's record, if
    it has one, counts as this run's (the sweep leaves it).
  Revisit.hand_out(now, most): with FRONTIER_KEEP_ALIVE (options.revisit), queue up to `most`
    due revisits of URLs nobody rediscovered; returns how many.
  Revisit.sweep(now, most): before a crawl run ends (options.sweep, FRONTIER_REVISIT_SWEEP:
    once nothing is left that could rediscover a page), queue up to `most` due revisits of
    URLs this run neither fetched nor rediscovered, so a page no longer linked is fetched
    once more and tells whether its items are gone (a 404, or a page that no longer yields
    them: project/frontier/revisit.py); a record no run rediscovered for long enough (above)
    is forgotten instead (a URL with a session id, minted again every run).
    Returns how many it queued, whether due ones are left to look at (a bounded scan: the
    run is not over yet), and how many it forgot.
]]
local Revisit = {}

do
    -- "<interval>\n<run>\n<site>\n<priority>\n<record>\n<payload>" -> its six parts
    local function split_revisit(stored)
        local parts, from = {}, 1
        for _ = 1, 5 do
            local nl = string.find(stored, '\n', from, true)
            if not nl then return nil end
            parts[#parts + 1] = string.sub(stored, from, nl - 1)
            from = nl + 1
        end
        parts[6] = string.sub(stored, from)
        return parts
    end

    local function with_record(payload, record)
        if string.sub(payload, -1) ~= '}' then return payload end
        return string.sub(payload, 1, -2) .. ',"revisit":' .. record .. '}'
    end

    local SITES, MISSED = K.revisit .. ':sites', K.revisit .. ':missed'

    -- A URL's record goes, and its site's count with it.
    local function forget(fp, site)
        if redis.call('HDEL', K.revisit, fp) == 1 and site
                and redis.call('HINCRBY', SITES, site, -1) <= 0 then
            redis.call('HDEL', SITES, site)
        end
        redis.call('ZREM', K.due, fp)
        redis.call('HDEL', MISSED, fp)
    end

    function Revisit.record(sec, now, limits)
        if sec.n == 0 then return 0 end
        local run = redis.call('HGET', K.runs, 'id') or ''
        local most, site_most = limits and limits[1], limits and limits[2]
        local capped = 0
        for e = 0, sec.n - 1 do
            local i = sec.at + e * sec.width
            local fp, interval = ARGV[i + sec.fingerprint], tonumber(ARGV[i + sec.interval_ms]) or 0
            local entry = ARGV[i + sec.record]
            local site = string.match(entry, '^([^\n]*)\n') or ''
            if interval > 0 then
                local stored = string.format('%.0f', interval) .. '\n' .. run .. '\n' .. entry
                if redis.call('HSET', K.revisit, fp, stored) == 1 then
                    -- a new URL: within the caps, or left out (a URL under policy all the same)
                    local of_site = redis.call('HINCRBY', SITES, site, 1)
                    if (site_most and of_site > site_most)
                            or (most and redis.call('HLEN', K.revisit) > most) then
                        forget(fp, site)
                        capped = capped + 1
                    else
                        redis.call('ZADD', K.due, now + interval, fp)
                    end
                else
                    redis.call('ZADD', K.due, now + interval, fp)
                end
            else
                local parts = split_revisit(redis.call('HGET', K.revisit, fp) or '')
                forget(fp, parts and parts[3])
            end
        end
        return capped
    end

    local current_run = nil -- read once per step, when a rediscovered URL is due

    function Revisit.due(fp, payload, now)
        local due = tonumber(redis.call('ZSCORE', K.due, fp))
        if not due then return nil end
        local parts = split_revisit(redis.call('HGET', K.revisit, fp) or '')
        if not parts then
            redis.call('ZREM', K.due, fp)
            return nil
        end
        if current_run == nil then current_run = redis.call('HGET', K.runs, 'id') or '' end
        if parts[2] ~= '' and parts[2] == current_run then return nil end
        -- dealt with in this run now: rediscovered again, it stays put
        parts[2] = current_run
        redis.call('HSET', K.revisit, fp, table.concat(parts, '\n'))
        redis.call('HDEL', MISSED, fp) -- still linked: its misses start again
        -- not due: still linked, so what its page gave last time is still there (the node
        -- bumps those items' last_seen)
        if due > now then return nil, parts[5] end
        redis.call('ZADD', K.due, now + (tonumber(parts[1]) or 0), fp)
        return with_record(payload, parts[5])
    end

    -- Queue up to `most` due revisits; `run` given (a sweep), only those of other runs, each
    -- then marked as this run's, and the ones of this run are due an interval later. Returns
    -- how many were queued and how many due ones it looked at.
    local function queue_due(now, most, run, forget_after)
        local fps = redis.call('ZRANGEBYSCORE', K.due, '-inf', now, 'LIMIT', 0, most)
        local entries, forgotten = {}, 0
        for _, fp in ipairs(fps) do
            local parts = split_revisit(redis.call('HGET', K.revisit, fp) or '')
            -- a record not written by a node (no site, no request): it goes
            if parts and (parts[3] == '' or string.sub(parts[6], 1, 1) ~= '{') then
                forget(fp, parts[3])
                parts = nil
            end
            if parts and run and parts[2] ~= run and forget_after then
                -- a run that ends without a link to it: one miss more, since the first
                local missed = redis.call('HGET', MISSED, fp) or ''
                local n, since = string.match(missed, '^(%d+):(%d+)$')
                n, since = (tonumber(n) or 0) + 1, tonumber(since) or now
                if forget_after[1] > 0 and n > forget_after[1] and now - since >= forget_after[2] then
                    forget(fp, parts[3])
                    forgotten = forgotten + 1
                    parts = nil
                else
                    redis.call('HSET', MISSED, fp, string.format('%d:%.0f', n, since))
                end
            end
            if parts then
                redis.call('ZADD', K.due, now + (tonumber(parts[1]) or 0), fp)
                if not run or parts[2] ~= run then
                    if run then
                        parts[2] = run
                        redis.call('HSET', K.revisit, fp, table.concat(parts, '\n'))
                    end
                    entries[#entries + 1] = {parts[3], clamp_priority(tonumber(parts[4]) or 0),
                                             with_record(parts[6], parts[5])}
                end
            else
                redis.call('ZREM', K.due, fp)
            end
        end
        if #entries > 0 then push_grouped(group_by_site(entries)) end
        return #entries, #fps, forgotten
    end

    -- A seed queued in this run: its URL's record is this run's, so the sweep leaves it
    -- (it is being fetched already, or failed in this run).
    function Revisit.seeded(fp)
        local parts = split_revisit(redis.call('HGET', K.revisit, fp) or '')
        if not parts then return end
        if current_run == nil then current_run = redis.call('HGET', K.runs, 'id') or '' end
        if current_run ~= '' and parts[2] ~= current_run then
            parts[2] = current_run
            redis.call('HSET', K.revisit, fp, table.concat(parts, '\n'))
            redis.call('HDEL', MISSED, fp)
        end
    end

    function Revisit.hand_out(now, most)
        return (queue_due(now, most))
    end

    function Revisit.sweep(now, most, limits)
        local run = redis.call('HGET', K.runs, 'id')
        if not run then return 0, false, 0 end -- no crawl run: nothing is "this run's"
        local forget_after = limits and {tonumber(limits[3]) or 0, tonumber(limits[4]) or 0}
        local queued, looked, forgotten = queue_due(now, most, run, forget_after)
        return queued, looked == most, forgotten
    end
end
