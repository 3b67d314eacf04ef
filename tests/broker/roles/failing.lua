-- A script role whose resolve fails: its error reaches the caller.
return {
    description = "Fails on purpose",
    resolve = function(args) error("the runbook index is missing") end,
}
