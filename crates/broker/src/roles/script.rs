//! A script role as the daemon holds it (`eval` runs it).

use std::sync::Arc;

use serde_json::Value;

use super::eval::{Answer, Job, Request, evaluate};
use super::lua::LuaLimits;
use super::{RoleArgs, RoleError, RoleInfo, RolePrompt, TeamContext};

/// A script role as the daemon holds it: its text and what it declares.
/// Its top level and each resolve run in an evaluator process.
#[derive(Debug, Clone)]
pub struct ScriptRole {
    pub info: RoleInfo,
    source: String,
    config: Value,
    limits: LuaLimits,
}

impl ScriptRole {
    /// Reads the script and runs its top level (in an evaluator, with the
    /// role's limits) to learn what it declares.
    pub fn load(
        role: &str,
        path: &std::path::Path,
        config: Value,
        limits: LuaLimits,
    ) -> Result<Self, RoleError> {
        let mut loaded = Self {
            info: RoleInfo {
                name: role.to_string(),
                description: String::new(),
                tools: Vec::new(),
                source: super::RoleSource::Lua,
                arguments: Vec::new(),
            },
            source: super::lua::read_script(role, path)?,
            config,
            limits,
        };
        match evaluate(&loaded.request(Job::Load), None)? {
            Answer::Info(info) if info.name == role => loaded.info = info,
            _ => return Err(loaded.odd_answer()),
        }
        Ok(loaded)
    }

    pub fn limits(&self) -> &LuaLimits {
        &self.limits
    }

    fn request(&self, job: Job) -> Request {
        Request {
            role: self.info.name.clone(),
            source: self.source.clone(),
            config: self.config.clone(),
            timeout_ms: u64::try_from(self.limits.timeout.as_millis()).unwrap_or(u64::MAX),
            memory_bytes: self.limits.memory_bytes,
            context_calls: self.limits.context_calls,
            job,
        }
    }

    fn odd_answer(&self) -> RoleError {
        RoleError::Script {
            role: self.info.name.clone(),
            message: "the evaluator gave an answer of the wrong kind".into(),
        }
    }
}

impl super::Role for ScriptRole {
    fn name(&self) -> &str {
        &self.info.name
    }
    fn description(&self) -> &str {
        &self.info.description
    }
    fn tools(&self) -> Vec<String> {
        self.info.tools.clone()
    }
    fn arguments(&self) -> Vec<super::RoleArgument> {
        self.info.arguments.clone()
    }
    fn bounded(&self) -> bool {
        true
    }
    fn resolve(
        &self,
        args: &RoleArgs,
        context: Arc<dyn TeamContext>,
    ) -> Result<RolePrompt, RoleError> {
        let job = Job::Resolve { args: args.clone() };
        match evaluate(&self.request(job), Some(context))? {
            Answer::Prompt(mut prompt) => {
                prompt.tools = self.info.tools.clone();
                super::check_prompt(&self.info.name, &prompt)?;
                Ok(prompt)
            }
            Answer::Info(_) => Err(self.odd_answer()),
        }
    }
}
