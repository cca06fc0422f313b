"""The model stage: `provider` (the seam every model sits behind, and `ScriptedModel`),
`stage` (committed completion requests in, `Completion` inputs out) and `providers/`
(OpenAI-compatible, Anthropic, Bedrock)."""
