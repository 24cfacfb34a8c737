--[[
  Leases that end without an acknowledgement: a node died, or gave them back.

  In-flight members (K.inflight, scored by deadline) are
    "<node>\nR<site>\n<payload>"   a leased request of <site> (R: CODE.member_request)
    "<node>\nS<raw>"                a leased seed, as pushed to the <spider>:start_urls list
                                   (S: CODE.seeds_list)
    "<node>\nT<raw>"                a leased seed of the set (REDIS_START_URLS_AS_SET;
                                   T: CODE.seeds_set)

  Needs KEYS: start_urls, and those of lib/site_queues.lua (included before this).
]]
-- Members go back where they came from, as they are.
local function put_back(members)
    local requests, seeds, set_seeds = {}, {}, {}
    for _, m in ipairs(members) do
        local nl = string.find(m, '\n', 1, true)
        local kind, body = string.sub(m, nl + 1, nl + 1), string.sub(m, nl + 2)
        if kind == CODE.seeds_list then
            seeds[#seeds + 1] = body
        elseif kind == CODE.seeds_set then
            set_seeds[#set_seeds + 1] = body
        else
            local site, payload = split_site(body)
            requests[#requests + 1] = {site, payload}
        end
    end
    push_payloads(requests)
    -- back to what the key is now (someone may have pushed to it as the other type since);
    -- a key of any other type takes none: they are counted as put back, and lost
    local now_type = redis.call('TYPE', K.start_urls).ok
    for _, s in ipairs(set_seeds) do seeds[#seeds + 1] = s end
    if #seeds > 0 then
        if now_type == 'set' or (now_type == 'none' and #set_seeds == #seeds) then
            chunked('SADD', K.start_urls, seeds)
        elseif now_type == 'list' or now_type == 'none' then
            chunked('RPUSH', K.start_urls, seeds)
        end
    end
    return #requests + #seeds
end
