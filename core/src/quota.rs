//! What the plan asks of the external GPU quota service; the calls themselves are the
//! operator's (`gpujob_operator::quota`).

/// What a reservation is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub gpus: i32,
}
