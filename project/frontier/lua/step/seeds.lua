--[[
  Phase 9, seeds: raw seeds from <spider>:start_urls are leased like requests,
  so a node that dies before it enqueued them does not lose them (they go back
  to the list when the lease expires).

  Keys: start_urls, inflight.
  ARGV section: none.
  Options used: node, seed_want
  Returns: seeds {raw, ...}
]]
local function take_seeds(count, deadline, node)
    local seeds = {}
    if count <= 0 then return seeds end
    local popped = redis.call('RPOP', K.start_urls, count)
    if not popped then return seeds end
    local args = {}
    local prefix = node .. '\nS'
    for _, raw in ipairs(popped) do
        args[#args + 1] = deadline
        args[#args + 1] = prefix .. raw
        seeds[#seeds + 1] = raw
    end
    chunked('ZADD', K.inflight, args, 2)
    return seeds
end
