//! The kinds and states the store keeps as text columns, as enums: each
//! has one text (its column value and its JSON), read back strictly (a text
//! no variant names is a column error, not a guess).

use super::values::{FromValue, ToValue, Value};

/// An enum stored as one fixed text per variant.
macro_rules! text_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text,)+ }
            }

            pub fn from_text(text: &str) -> Option<Self> {
                match text { $($text => Some(Self::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl ToValue for $name {
            fn to_value(&self) -> Value {
                Value::Text(self.as_str().to_owned())
            }
        }

        impl FromValue for $name {
            fn from_value(value: &Value) -> Result<Self, String> {
                let text = String::from_value(value)?;
                Self::from_text(&text)
                    .ok_or_else(|| format!("`{text}` is not a {}", stringify!($name)))
            }
        }
    };
}

text_enum! {
    /// What a message is: who sent it and what its recipient owes.
    pub enum MessageKind {
        /// `send_message` from an agent.
        Message = "message",
        /// `broadcast` from an agent, one row per recipient.
        Broadcast = "broadcast",
        /// A sync message's answer: the recipient's final answer.
        Reply = "reply",
        /// A sync message whose recipient's turn failed.
        NoReply = "no_reply",
        /// `spawn_agent`'s instructions to the new child.
        Instructions = "instructions",
        /// A child's report to its parent when it finished its instructions.
        Report = "report",
        /// `agent send` from the operator.
        Operator = "operator",
    }
}

text_enum! {
    /// Where a message is.
    pub enum MessageStatus {
        /// Waits in the inbox for `check_inbox`.
        Queued = "queued",
        /// Delivered as the prompt of a turn.
        Turn = "turn",
        /// Read by `check_inbox`.
        Delivered = "delivered",
    }
}

text_enum! {
    /// Where a turn is.
    pub enum TurnStatus {
        Queued = "queued",
        Running = "running",
        Done = "done",
        Failed = "failed",
        /// Never ran: its agent was removed.
        Cancelled = "cancelled",
    }
}

text_enum! {
    /// What a turn delivers: a message of one kind, or the operator's
    /// `agent resume --prompt`.
    pub enum TurnKind {
        Message = "message",
        Broadcast = "broadcast",
        Reply = "reply",
        NoReply = "no_reply",
        Instructions = "instructions",
        Report = "report",
        Operator = "operator",
        Resume = "resume",
    }
}

text_enum! {
    /// A pinned upstream tool's state.
    pub enum PinStatus {
        /// Its definition is the approved one: offered.
        Approved = "approved",
        /// New and flagged, or changed since approved: withheld.
        Quarantined = "quarantined",
    }
}

text_enum! {
    /// The state an agent is stored in (the `agents.state` column).
    pub enum StoredState {
        /// Takes turns.
        Active = "active",
        /// Takes none until resumed (`agent suspend`).
        Suspended = "suspended",
        /// Its last turn failed or was killed; resumed by the operator.
        Failed = "failed",
    }
}

impl StoredState {
    /// The state a column's text names; an unknown text is a failed agent
    /// (it takes no turns until the operator looks).
    pub fn from_column(text: &str) -> StoredState {
        Self::from_text(text).unwrap_or(StoredState::Failed)
    }
}

text_enum! {
    /// What an agent is doing, derived from its stored state and its turns
    /// (docs/agents.md).
    pub enum AgentState {
        Idle = "idle",
        Busy = "busy",
        Waiting = "waiting",
        Suspended = "suspended",
        Failed = "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_text_reads_back_as_its_variant_and_others_are_refused() {
        for kind in [
            MessageKind::Message,
            MessageKind::NoReply,
            MessageKind::Operator,
        ] {
            assert_eq!(MessageKind::from_text(kind.as_str()), Some(kind));
        }
        assert_eq!(MessageKind::from_text("Message"), None);
        assert_eq!(
            TurnStatus::from_text("cancelled"),
            Some(TurnStatus::Cancelled)
        );
        assert_eq!(
            serde_json::to_value(PinStatus::Quarantined).ok(),
            Some(serde_json::json!("quarantined"))
        );
        let read = TurnStatus::from_value(&Value::Text("lost".into()));
        assert!(read.is_err(), "{read:?}");
        let read = TurnStatus::from_value(&Value::Int(1));
        assert!(read.is_err(), "{read:?}");
        let read = TurnStatus::from_value(&TurnStatus::Running.to_value());
        assert_eq!(read.ok(), Some(TurnStatus::Running));
    }
}
