-- Attacks on a script role's limits (issue 39), one per `case`: each
-- must end with its error within the time limit and a little more.
local agent = { name = "attack", arguments = {
  { name = "case", required = true }, { name = "subject" }, { name = "pattern" } } }
local loop = function() while true do end end
local c = {}
c.error_tostring = function() error(setmetatable({}, { __tostring = loop })) end
c.error_index = function() error(setmetatable({}, { __index = loop })) end
c.xpcall_loop = function() return xpcall(error, loop) end
c.xpcall_again = function() return xpcall(error, function(e) error(e) end) end
c.close = function() do local x <close> = setmetatable({}, { __close = loop }) end end
c.len = function() return #setmetatable({}, { __len = loop }) end
c.index = function() return setmetatable({}, { __index = loop }).x end
c.eq = function() local mt = { __eq = loop } return setmetatable({}, mt) == setmetatable({}, mt) end
c.lt = function() local mt = { __lt = loop } return setmetatable({}, mt) < setmetatable({}, mt) end
c.concat = function() return setmetatable({}, { __concat = loop }) .. "x" end
c.gc = function() setmetatable({}, { __gc = loop }) end
c.rep = function() return ("x"):rep(1e10) end
c.table_concat = function() local t = {} for i = 1, 64 do t[i] = ("x"):rep(1 << 20) end return table.concat(t) end
c.sort_loop = function() local t = {} for i = 1, 100 do t[i] = i end table.sort(t, loop) end
c.sort_error = function() local t = { 3, 1, 2 } table.sort(t, function() error("cmp") end) end
c.format = function() return string.format("%99999d", 1) end
c.utf8_char = function() local t = {} for i = 1, 1e6 do t[i] = 0x10FFFF end return utf8.char(table.unpack(t)) end
c.utf8_codes = function() local n = 0 for _, x in utf8.codes(("\u{10FFFF}"):rep(1 << 22)) do n = n + 1 end return n end
c.find = function() return string.find(("a"):rep(30), ("a*"):rep(30) .. "b") end
c.match = function() return string.match(("a"):rep(30), ("a*"):rep(30) .. "b") end
c.gsub = function() return string.gsub(("a"):rep(30), ("a*"):rep(30) .. "b", "") end
c.gmatch = function() for m in string.gmatch(("a"):rep(30), ("a*"):rep(30) .. "b") do end end
c.args = function(args) return string.find(args.subject, args.pattern) end
c.ok = function() return "ok" end
c.spin = loop
function agent.resolve(args)
  return { system = tostring(c[args.case](args)) }
end
return agent
