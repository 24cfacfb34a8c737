--[[
  Phase 8, lease ahead, for the sites this node already works on: more of their
  requests, so that when one of its downloads ends the next one starts without a round
  trip (they take no permit), and permits for requests of theirs it holds but may not
  start yet, within the site's cap and this node's share of it (lib/grants.lua). Spare
  permits the requests taken do not use go back, for other nodes.

  A node holds at most its share of a site's cap, the cap divided by the nodes stepping
  (K.holders), so one node does not take a whole site while another waits; its permits
  above the share go back as its downloads end (project/frontier/ledger.py).

  Keys: those of lib/grants.lua.
  ARGV section ahead: site requests permits held spare
    site      a site this node holds permits of or requests for
    requests  requests of it wanted ahead
    permits   permits wanted, for requests it holds but may not start yet
    held      permits of it this node holds
    spare     of those, how many have no request to start (the requests taken ahead use
              them first; the rest go back)
  Options used: want, slots, limits (through the grant)
  Returns: nothing; fills the grant's got.shares {site, share, back, ...} (share: this
           node's share of the site's cap, 0 for none; back: spare permits given back)
]]
local Ahead = {}

function Ahead.run(sec, ask, budget, got, limits)
    for e = 0, sec.n - 1 do
        local i = sec.at + e * sec.width
        local site = ARGV[i + sec.site]
        local n = math.min(tonumber(ARGV[i + sec.requests]), budget.want)
        local wanted = math.min(tonumber(ARGV[i + sec.permits]), budget.slots)
        local held, spare = tonumber(ARGV[i + sec.held]), tonumber(ARGV[i + sec.spare])
        if got.rejoined then held, spare = 0, 0 end
        local rate, conc = site_limits(site, limits)
        local share = 0
        if conc > 0 then share = share_of(conc, ask) end
        local taken = 0
        -- a paused or rate-limited site waits in K.throttled: nothing ahead of its time
        if (n > 0 or wanted > 0) and not redis.call('ZSCORE', K.throttled, site) then
            if wanted > 0 then grant(site, wanted, conc, held, ask, budget, got) end
            local tokens = 0
            if rate > 0 then
                tokens = bucket_tokens(site, rate, ask.now, limits)
                n = math.min(n, math.floor(tokens))
            end
            if n > 0 then
                taken = take(site, n, ask, budget, got)
                tokens = tokens - taken
                -- emptied: out of the index (an index score below the new head is harmless)
                if taken < n then redis.call('ZREM', K.queue, site) end
            end
            if rate > 0 and n > 0 then
                redis.call('HSET', K.buckets, site, tokens .. ' ' .. ask.now)
                if tokens < 1 then
                    park_for_rate(site, tokens, rate, ask.now)
                    got.throttled_changed = true
                end
            end
        end
        local back = 0
        if spare > taken then back = give_back(ask.node, site, spare - taken) end
        budget.held[site] = held - back
        got.shares[#got.shares + 1] = site
        got.shares[#got.shares + 1] = share
        got.shares[#got.shares + 1] = back
    end
end
