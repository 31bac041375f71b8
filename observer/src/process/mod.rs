//! The process's own conduct, the same for every command: its heap
//! policy (`heap`), closed pipes that end it quietly (`pipe`), and the
//! privileges it keeps once attached (`privileges`).

pub mod heap;
pub mod pipe;
pub mod privileges;
