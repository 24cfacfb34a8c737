--[[
  Phase 6c, render: what this node's fetches taught about which pages need a browser
  (project/rendering/plan.py), then the patterns that changed since the version this node
  knows. A pattern is "<site>\t<path template>\t<callback>"; its mode is the fleet's, so
  what one node learns every node uses from its next step on.

  Keys: render.
    render          pattern -> {h = its last outcomes, oldest first ('a': the plain fetch
                    found what the browser found, 'm': it missed something), a = agrees,
                    m = misses, i = fewest items a browser render of it yielded (-1: none
                    yet), f = the fields every browser item had, t = ms of its last
                    outcome, mode}; render:v: the version of the newest change (ms, Redis'
                    time); render:changed: each pattern scored by the version of its last
                    change (maintenance forgets the ones unchanged for options.forget_ms)
  ARGV section render: pattern outcome data
    outcome 'a' or 'm'; data: JSON {i = items of the browser's render, f = [field, ...]
                    its items all had}. A pattern past options.most is not kept.
  Options used: render = {known = the version this node knows (-1: none), most, forget_ms}
  Returns: {version, changes JSON}: the version now and, when it is not the one the node
           knows, {pattern = {mode, a, m, i, f}} of the patterns changed since (all of them
           when the node knows none); and whether the fleet keeps options.most patterns
           (the node renders unknown ones, it does not learn them)
]]
local Render = {}

do
    -- outcomes a pattern keeps; the mode reads the last SETTLE
    local HISTORY = 8
    local SETTLE = 3
    -- patterns one maintenance forgets at most
    local FORGET = 50

    -- a miss among the last outcomes: the browser; SETTLE agreeing ones: plain HTTP
    local function mode_of(h)
        local recent = string.sub(h, -SETTLE)
        if string.find(recent, 'm', 1, true) then return 'browser' end
        if #recent >= SETTLE then return 'http' end
        return 'learn'
    end

    -- a pattern's record, or nil when what is stored is not one (anyone may write Redis)
    local function record(raw)
        local ok, p = pcall(cjson.decode, raw)
        if not ok or type(p) ~= 'table' or type(p.h) ~= 'string' or type(p.a) ~= 'number'
                or type(p.m) ~= 'number' or type(p.i) ~= 'number'
                or type(p.f) ~= 'table' then
            return nil
        end
        return p
    end

    local function bump(pattern, now)
        local version = tonumber(redis.call('GET', K.render .. ':v') or 0)
        version = math.max(now, version + 1)
        redis.call('SET', K.render .. ':v', version)
        redis.call('ZADD', K.render .. ':changed', version, pattern)
    end

    function Render.run(sec, now, o)
        if not o then return {} end
        for e = 0, sec.n - 1 do
            local i = sec.at + e * sec.width
            local pattern, outcome = ARGV[i + sec.pattern], ARGV[i + sec.outcome]
            local raw = redis.call('HGET', K.render, pattern)
            local p = raw and record(raw)
            if not p then raw = false end -- a record that is not one is made again
            if (outcome == 'a' or outcome == 'm')
                    and (raw or redis.call('HLEN', K.render) < o.most) then
                p = p or {h = '', a = 0, m = 0, i = -1, f = {}}
                local ok, data = pcall(cjson.decode, ARGV[i + sec.data])
                if not ok or type(data) ~= 'table' then data = {} end
                local items = tonumber(data.i) or 0
                local fields = type(data.f) == 'table' and data.f or {}
                p.h = string.sub(p.h .. outcome, -HISTORY)
                if outcome == 'a' then p.a = p.a + 1 else p.m = p.m + 1 end
                -- what a browser render of the pattern yields when it yields anything (an
                -- empty page, a soft 404, says nothing of the others): a plain page that
                -- yields less is looked at again (project/rendering/plan.py)
                if items <= 0 or items ~= items then
                    -- nothing to learn of its items
                elseif p.i <= 0 then
                    p.i, p.f = items, fields
                elseif raw then
                    p.i = math.min(p.i, items)
                    local keep, common = {}, {}
                    for _, f in ipairs(fields) do keep[f] = true end
                    for _, f in ipairs(p.f) do
                        if keep[f] then common[#common + 1] = f end
                    end
                    p.f = common
                end
                p.t = now
                p.mode = mode_of(p.h)
                -- an empty Lua table encodes as {}; the node reads either as no fields
                redis.call('HSET', K.render, pattern, cjson.encode(p))
                bump(pattern, now)
            end
        end
        local version = tonumber(redis.call('GET', K.render .. ':v') or 0)
        local full = redis.call('HLEN', K.render) >= o.most and 1 or 0
        if version == tonumber(o.known) then return {version, '', full} end
        local changed = redis.call('ZRANGEBYSCORE', K.render .. ':changed',
                                   '(' .. tostring(o.known), '+inf')
        local out = {}
        for _, pattern in ipairs(changed) do
            local p = record(redis.call('HGET', K.render, pattern) or '')
            if p then
                out[pattern] = {p.mode, p.a, p.m, p.i, p.f}
            else
                out[pattern] = false -- forgotten
            end
        end
        return {version, next(out) and cjson.encode(out) or '{}', full}
    end

    -- Maintenance: patterns with no outcome for options.forget_ms go, FORGET at a time (a
    -- site that changed its pages is learnt again). Returns how many were forgotten.
    function Render.forget(now, o)
        if not o then return 0 end
        local old = redis.call('ZRANGEBYSCORE', K.render .. ':changed', '-inf',
                               now - o.forget_ms, 'LIMIT', 0, FORGET)
        if #old == 0 then return 0 end
        local version = tonumber(redis.call('GET', K.render .. ':v') or 0)
        local forgotten, tombstones = 0, {}
        for _, pattern in ipairs(old) do
            if redis.call('HDEL', K.render, pattern) == 1 then
                -- the nodes hear of it by the version: it stays in :changed, with no
                -- record, until a later forget finds it old
                forgotten = forgotten + 1
                version = math.max(now, version + 1)
                redis.call('ZADD', K.render .. ':changed', version, pattern)
            else
                tombstones[#tombstones + 1] = pattern
            end
        end
        chunked('ZREM', K.render .. ':changed', tombstones)
        redis.call('SET', K.render .. ':v', version)
        return forgotten
    end
end
