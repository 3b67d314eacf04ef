//! A place in a policy file, for errors and findings.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// A place in a policy file. Lines and columns count from 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl Location {
    /// The first line of a file: where findings about absent keys point.
    pub fn start_of(file: &Path) -> Self {
        Self {
            file: file.to_path_buf(),
            line: 1,
            column: 1,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}
