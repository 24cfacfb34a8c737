--[[
  Phase 9, seeds: raw seeds from <spider>:start_urls are leased like requests,
  so a node that dies before it enqueued them does not lose them (they go back
  where they came from when the lease expires: lib/leases.lua).

  Keys: start_urls, inflight.
  Needs lib/seeds.lua (refused).
  ARGV section: none.
  Options used: node, seed_want
  Seeds are taken from what the key is: a list (RPOP) or a set (SPOP: REDIS_START_URLS_AS_SET,
  or anyone's `redis-cli sadd`); a key of another type gives none (no error after the
  phases before this one have written).
  Returns: seeds {raw, ...}, and their kind: CODE.seeds_list from a list, CODE.seeds_set
           from a set
]]
local Seeds = {}

function Seeds.take(count, deadline, node)
    local seeds = {}
    if count <= 0 then return seeds, CODE.seeds_list end
    -- a list, or no key, answers the RPOP (one command where TYPE then RPOP were two); a
    -- set refuses it (WRONGTYPE) and answers SPOP; any other type refuses both
    local popped, tag = redis.pcall('RPOP', K.start_urls, count), CODE.seeds_list
    if refused(popped) then
        popped, tag = redis.pcall('SPOP', K.start_urls, count), CODE.seeds_set
        if refused(popped) then return seeds, CODE.seeds_list end
    end
    if not popped or #popped == 0 then return seeds, tag end
    local args = {}
    local prefix = node .. '\n' .. tag
    for _, raw in ipairs(popped) do
        args[#args + 1] = deadline
        args[#args + 1] = prefix .. raw
        seeds[#seeds + 1] = raw
    end
    chunked('ZADD', K.inflight, args, 2)
    return seeds, tag
end
