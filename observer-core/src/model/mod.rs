//! Pure logic on plain data, no I/O: the rows kernel maps decode into,
//! their aggregation into monotonic totals and rates, the anomaly engine,
//! the port assignment.

pub mod after_decap;
pub mod aggregate;
pub mod anomalies;
pub mod bgp;
pub mod bgp_wire;
pub mod cluster;
pub mod crosscheck;
pub mod dataplane;
pub mod diagnosis;
pub mod evidence;
pub mod facts;
pub mod health;
pub mod hooks;
pub mod kernel;
pub mod ports;
pub mod probe;
pub mod read_order;
pub mod routes;
pub mod rows;
pub mod verdicts;
