//! Offline tools: the detector's maths run on recorded or generated traces instead of live
//! slots. Traces (reading, writing, generating), replay on a virtual clock with QoS metrics,
//! the frontier of a detector family, and its SVG plot (`monitor replay`, `monitor record`).
//! The last stage of the flow: it reads the detector (and the arrival lines serving streams);
//! nothing upstream reads it.

pub mod frontier;
pub mod generate;
pub mod plot;
pub mod replay;
pub mod trace;
