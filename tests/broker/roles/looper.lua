-- A script role whose resolve never ends: the broker must say so and
-- keep serving.
return {
    description = "Loops forever",
    resolve = function() while true do end end,
}
