--[[
  Variadic Redis calls in chunks: unpack() puts every value on Lua's C stack,
  which holds a few thousand (LUAI_MAXCSTACK = 8000), and a batch can be larger.

  chunked(command, key, args, width, flag): runs `command key [flag] args...`
  over slices of at most CHUNK values that keep entries of `width` values
  (2 for ZADD's score/member pairs) whole; returns the sum of the replies.
  chunked_list(command, key, args): the same for commands that reply with one
  value per argument (SMISMEMBER, ZMSCORE); returns the concatenated replies.
]]
local CHUNK = 1000

local function chunked(command, key, args, width, flag)
    local total = 0
    local per = CHUNK - CHUNK % (width or 1)
    for first = 1, #args, per do
        local last = math.min(#args, first + per - 1)
        local reply
        if flag then
            reply = redis.call(command, key, flag, unpack(args, first, last))
        else
            reply = redis.call(command, key, unpack(args, first, last))
        end
        total = total + (tonumber(reply) or 0)
    end
    return total
end

local function chunked_list(command, key, args)
    local out = {}
    for first = 1, #args, CHUNK do
        local reply = redis.call(command, key, unpack(args, first, math.min(#args, first + CHUNK - 1)))
        for _, value in ipairs(reply) do out[#out + 1] = value end
    end
    return out
end
