// The delivery model (records, jobs, the lane rules) lives in IsleDelivery, which knows nothing of
// storage; every store speaks it, so whoever imports a store gets it too.
@_exported public import IsleDelivery
