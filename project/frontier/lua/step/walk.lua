--[[
  Phase 8b, the walk: up to `slots` requests with a new permit each, best ready site
  first, each site within its token bucket (rate), its fleet-wide cap of permits and
  this node's share of it (lib/grants.lua). A site that must wait leaves the ready
  index: for K.throttled, scored by when it may go again (rate), or for K.capped until
  one of its permits comes back.

  Keys: those of lib/grants.lua, capped, recent, queued.
  ARGV section: none.
  Options used: want, slots, limits (through the grant)
  Returns: nothing; fills the grant's got (leased, permits)
]]
local MAX_SITES_PER_LEASE = 32  -- sites looked at per step, so one step stays short

local Walk = {}

function Walk.run(ask, budget, got, limits)
    local now = ask.now
    local scanned, skip = 0, 0
    while budget.slots > 0 and budget.want > 0 and scanned < MAX_SITES_PER_LEASE do
        scanned = scanned + 1
        local best = redis.call('ZRANGE', K.queue, skip, skip)
        if #best == 0 then break end
        local site = best[1]
        local rate, conc = site_limits(site, limits)
        local allowed = math.min(budget.slots, budget.want)
        local active = 0
        if conc > 0 then
            active = tonumber(redis.call('HGET', K.active, site) or 0)
            allowed = math.min(allowed, conc - active,
                               share_of(conc, ask) - (budget.held[site] or 0))
        end
        local tokens = 0
        if rate > 0 then
            tokens = bucket_tokens(site, rate, now, limits)
            allowed = math.min(allowed, math.floor(tokens))
        end
        local n, last = 0, nil
        if allowed > 0 then n, last = take(site, allowed, ask, budget, got) end
        if n > 0 then
            record_permits(site, n, ask, budget, got)
            active = active + n
            tokens = tokens - n
        end
        if rate > 0 then redis.call('HSET', K.buckets, site, tokens .. ' ' .. now) end
        -- re-index: drop an emptied site, park a site that must wait
        if n < allowed then
            redis.call('ZREM', K.queue, site)
        elseif conc > 0 and active >= conc then
            redis.call('ZREM', K.queue, site)
            redis.call('SADD', K.capped, site)
        elseif n == 0 then
            skip = skip + 1 -- this node's share of it is used up: the next site, if any
        elseif rate > 0 and tokens < 1 then
            if site_head(site, last) then
                park_for_rate(site, tokens, rate, now)
                got.throttled_changed = true
            else
                redis.call('ZREM', K.queue, site)
            end
        else
            reindex_site(site, last)
        end
    end
end
