"""The census of live tensors: what holds each storage, who made it, which roots to walk and when."""
