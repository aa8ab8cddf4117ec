"""HTTP front door: job API and OpenAI-compatible routes. Never touches a model."""
