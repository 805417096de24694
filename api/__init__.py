"""The REST API: FastAPI app, auth, schemas, thin handlers, error mapping."""
