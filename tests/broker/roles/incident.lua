-- A script role for the tests (seed 004 §3.2): the system prompt depends
-- on its arguments, its policy's config and the team.
local agent = {}
agent.name = "responder"
agent.description = "Triages incidents with the team's help"
agent.tools = { "send_message", "check_inbox" }
agent.arguments = {
    { name = "service", description = "The service with the incident", required = true },
    { name = "severity", description = "P1, P2 or P3" },
}

function agent.resolve(args, config, context)
    local team = context.team()
    local names = {}
    for _, member in ipairs(team) do
        names[#names + 1] = member.name
    end
    return {
        system = string.format(
            "You respond to a %s incident on %s. Escalate to %s. Team: %s.",
            args.severity or "P2", args.service, config.escalate_to, table.concat(names, ", ")),
        messages = {
            { role = "assistant", content = "Ready to triage " .. args.service .. "." },
        },
    }
end

return agent
