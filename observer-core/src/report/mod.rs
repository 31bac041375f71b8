//! What the observer prints and writes: JSON lines (`lines`, whose `Line`
//! enum is the schema), the table for people (`table`), the
//! node_exporter textfile (`textfile`); `view` is the per-interval
//! snapshot and the helpers these renderers share.

pub mod check;
pub mod cluster;
pub mod diagnosis;
pub mod evidence;
pub mod lab;
pub mod lines;
#[cfg(feature = "testing")]
pub mod mesh;
pub mod probe;
pub mod replay;
pub mod table;
pub mod textfile;
pub mod view;

pub use lines::{Line, write_line};

/// Output format (`--output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table refreshed every interval (default on a terminal).
    Table,
    /// One JSON object per line (default when stdout is not a terminal).
    Json,
}

impl Format {
    /// `chosen`, else a table on a terminal and JSON otherwise.
    pub fn or_default(chosen: Option<Format>) -> Format {
        chosen.unwrap_or(if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            Format::Table
        } else {
            Format::Json
        })
    }
}
