--[[
  Phase 1, enqueue: requests the node's callbacks produced, checked against the
  sites the crawl may visit and against the seen-set, and pushed to their sites'
  queues. One SMISMEMBER on each set for the whole batch, one ZADD per site.

  Keys: dupefilter (and the keys of lib/seen.lua), allowed, seq, queue, throttled, queued,
        revisit, due, runs, and the site queues.
  ARGV section enqueue: fingerprint site priority payload scope
    fingerprint          the mode, then the request's fingerprint. Modes (CODE, from
                         project/frontier/codes.py): mode_filter: dropped if seen;
                         mode_always (dont_filter): queued anyway, and marked as seen;
                         mode_revisit: a URL under a revisit policy (project/frontier/
                         revisit.py): dropped if seen, unless its revisit is due (`due`
                         scores it); then it goes again with its last fetch's record
                         (step/revisit.lua), and is due again one interval later;
                         mode_seed: a seed or a request of start() (the fleet's
                         dont_filter): queued once per crawl run (options.runs), else
                         once per batch
    site                 the politeness unit the request counts against
    priority             Scrapy's request priority (clamped to +-PRIORITY_LIMIT)
    payload              the request as JSON (project/frontier/wire.py)
    scope                where the request may go (its first character: a CODE scope):
                           ''                 anywhere (the spider's allowed_domains decide)
                           scope_seed         a seed: its site joins the allowed sites
                           scope_allowed      only if its site is allowed
                           scope_seed host, scope_allowed host  the same, for a request
                                              whose politeness unit is not its host (meta
                                              download_slot): host is its URL's site
                           scope_redirect site  a redirect within one domain: only if the
                                              site it came from is allowed; then its own
                                              site joins
  Options: list_dupes (true): also return the batch positions (0-based) of the duplicates,
  for DUPEFILTER_DEBUG's log lines; seen: the seen-set's form (lib/seen.lua); runs (true):
  the fleet keeps crawl runs (lua/run_join.lua), and a seed of a node in the current run is
  queued once in it (before the node joined, once per batch). If the seen-set was empty as the run began
  ('fresh' in `runs`), a seen seed was seen in this run and is a duplicate; if not, a seed
  is a duplicate when it is in
  "<runs>:seeds" (the seeds queued in this run, deleted with the run) or was queued earlier
  in the batch. (There, a URL first found in this run by a link, in an earlier step than its
  seed, is queued once more by the seed: the seen-set cannot say when it saw a URL.)
  Returns: added, duplicates, offsite (dropped for their scope), {duplicate position, ...},
           revisits (seen URLs queued again because they were due), {record, ...} of URLs
           rediscovered before their revisit is due (step/revisit.lua)
]]
local Enqueue = {}

do
    local MAX_STILL = 1000 -- records of rediscovered URLs not due, returned per step

    -- The URL's own site of a '+' or '=' scope: written after the sign when it differs
    local function own_site(scope, site)
        if #scope > 1 then return string.sub(scope, 2) end
        return site
    end

    local function in_scope(sec)
        -- one SMISMEMBER for every site the batch asks about; seeds in the batch count too
        local asked, index, allowed = {}, {}, {}
        for e = 0, sec.n - 1 do
            local i = sec.at + e * sec.width
            local scope, url_site = ARGV[i + sec.scope], ARGV[i + sec.site]
            local kind = string.sub(scope, 1, 1)
            local site = nil
            if kind == CODE.scope_allowed then site = own_site(scope, url_site)
            elseif kind == CODE.scope_redirect then site = string.sub(scope, 2) end
            if kind == CODE.scope_seed then allowed[own_site(scope, url_site)] = true end
            if site and not index[site] then
                asked[#asked + 1] = site
                index[site] = #asked
            end
        end
        if #asked > 0 then
            local flags = chunked_list('SMISMEMBER', K.allowed, asked)
            for site, j in pairs(index) do allowed[site] = allowed[site] or flags[j] == 1 end
        end
        local keep, joining = {}, {}
        for e = 0, sec.n - 1 do
            local i = sec.at + e * sec.width
            local scope, url_site = ARGV[i + sec.scope], ARGV[i + sec.site]
            local kind = string.sub(scope, 1, 1)
            local ok = true
            if kind == CODE.scope_allowed then ok = allowed[own_site(scope, url_site)]
            elseif kind == CODE.scope_redirect then ok = allowed[string.sub(scope, 2)] end
            if ok then
                keep[#keep + 1] = e
                if kind == CODE.scope_seed then joining[#joining + 1] = own_site(scope, url_site)
                elseif kind == CODE.scope_redirect then joining[#joining + 1] = url_site end
            end
        end
        if #joining > 0 then chunked('SADD', K.allowed, joining) end
        return keep
    end

    -- The crawl run this node's seeds are queued once in ({fresh}), read before the batch
    -- marks anything: nil when the fleet keeps no runs or the node has not joined the current
    -- one (it may be a run nobody will end). Before any run, the first marks of an empty
    -- seen-set are remembered: the run that begins next is fresh (lua/run_join.lua)
    local function seeds_run(opt)
        if not opt.runs then return nil end
        local state = redis.call('HMGET', K.runs, 'id', 'fresh', 'seen_began')
        if state[1] and redis.call('SISMEMBER', K.runs .. ':members', opt.node) == 1 then
            return {fresh = state[2] == '1'}
        end
        if not state[1] and not state[3] and seen_empty() then
            redis.call('HSET', K.runs, 'seen_began', 1)
        end
        return nil
    end

    -- Whether a seed was queued as a seed in this run already (a run whose seen-set was not
    -- fresh); it is one of the run's seeds from now on
    local function seed_queued(fp)
        return redis.call('SADD', K.runs .. ':seeds', fp) == 0
    end

    function Enqueue.run(sec, opt, now)
        if sec.n == 0 then return 0, 0, 0, {}, 0, {} end
        local keep = in_scope(sec)
        local fps = {}
        for j, e in ipairs(keep) do fps[j] = string.sub(ARGV[sec.at + e * sec.width + sec.fingerprint], 2) end
        local run = seeds_run(opt)
        local flags = seen_mark(fps, opt.seen)
        local fresh, listed, in_batch, pushed, still = {}, {}, {}, {}, {}
        local dupes, revisits = 0, 0
        for j, e in ipairs(keep) do
            local i = sec.at + e * sec.width
            local mode = string.sub(ARGV[i + sec.fingerprint], 1, 1)
            local payload = ARGV[i + sec.payload]
            local seen = flags[j]
            if seen and mode == CODE.mode_revisit and not in_batch[fps[j]] then
                local record
                payload, record = Revisit.due(fps[j], payload, now)
                if payload then revisits = revisits + 1; seen = false end
                if record and #still < MAX_STILL then still[#still + 1] = record end
            end
            if mode == CODE.mode_seed and not run then
                seen = pushed[fps[j]] == true -- no run to go by: once in a batch
            elseif mode == CODE.mode_seed and not run.fresh then
                -- seen before this step says nothing about this run: queued in it is what counts
                seen = seed_queued(fps[j]) or pushed[fps[j]] == true
            end
            in_batch[fps[j]] = true
            if seen and mode ~= CODE.mode_always then
                dupes = dupes + 1
                if opt.list_dupes then listed[#listed + 1] = e end
            else
                pushed[fps[j]] = true
                if mode == CODE.mode_seed then Revisit.seeded(fps[j]) end
                local priority = clamp_priority(tonumber(ARGV[i + sec.priority]) or 0)
                fresh[#fresh + 1] = {ARGV[i + sec.site], priority, payload or ARGV[i + sec.payload]}
            end
        end
        if #fresh > 0 then push_grouped(group_by_site(fresh)) end
        return #fresh, dupes, sec.n - #keep, listed, revisits, still
    end
end
