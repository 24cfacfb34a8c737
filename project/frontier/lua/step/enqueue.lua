--[[
  Phase 1, enqueue: requests the node's callbacks produced, checked against the
  seen-set and pushed to their sites' queues. One SMISMEMBER and one SADD for
  the whole batch, one ZADD per site.

  Keys: dupefilter, seq, queue, throttled, queued, and the site queues.
  ARGV section, ENQUEUE_WIDTH values per request:
    mode .. fingerprint  'f' + fingerprint: dropped if seen; 'm' + fingerprint
                         (dont_filter): queued anyway, and marked as seen
    site                 the politeness unit the request counts against
    priority             Scrapy's request priority (clamped to +-PRIORITY_LIMIT)
    payload              the request as JSON (project/frontier/wire.py)
  Returns: added, duplicates
]]
local ENQUEUE_WIDTH = 4

local function enqueue(at, count)
    if count == 0 then return 0, 0 end
    local fps = {}
    for e = 0, count - 1 do fps[#fps + 1] = string.sub(ARGV[at + e * ENQUEUE_WIDTH], 2) end
    local flags = chunked_list('SMISMEMBER', K.dupefilter, fps)
    local in_batch, fresh, new_fps = {}, {}, {}
    local dupes = 0
    for e = 0, count - 1 do
        local fp = fps[e + 1]
        local filter = string.sub(ARGV[at + e * ENQUEUE_WIDTH], 1, 1) == 'f'
        local seen = flags[e + 1] == 1 or in_batch[fp]
        if filter and seen then
            dupes = dupes + 1
        else
            if not seen then
                in_batch[fp] = true
                new_fps[#new_fps + 1] = fp
            end
            local i = at + e * ENQUEUE_WIDTH
            fresh[#fresh + 1] = {ARGV[i + 1], clamp_priority(tonumber(ARGV[i + 2]) or 0), ARGV[i + 3]}
        end
    end
    if #new_fps > 0 then chunked('SADD', K.dupefilter, new_fps) end
    if #fresh > 0 then push_grouped(group_by_site(fresh)) end
    return #fresh, dupes
end
