--[[
  The step's ARGV sections, laid out by the node (project/frontier/queue.py SECTIONS) and
  sent as options.sections: {{name, entries, {field, ...}}, ...}, in ARGV order from
  ARGV[2]. read_sections turns that into S[name] = {at = first ARGV index, n = entries,
  width = fields per entry, [field] = its offset in an entry (0-based)}, so entry e's
  field f is ARGV[sec.at + e * sec.width + sec.f]. A section the node did not send is
  empty ({n = 0}), so a phase never reads another's values.
]]
local NO_SECTION = {at = 0, n = 0, width = 0}

local function read_sections(layout)
    local S, at = {}, 2
    for _, s in ipairs(layout) do
        local sec = {at = at, n = tonumber(s[2]) or 0, width = #s[3]}
        for j, field in ipairs(s[3]) do sec[field] = j - 1 end
        S[s[1]] = sec
        at = at + sec.n * sec.width
    end
    return setmetatable(S, {__index = function() return NO_SECTION end})
end
