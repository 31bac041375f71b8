//! What the observer prints and writes: JSON lines, the table, the
//! node_exporter textfile.

pub mod output;
pub mod textfile;
