"""Code every remediation function shares.

Cloud-neutral: ``config`` (environment checked at cold start), ``log`` (one JSON line per
decision), ``events`` (validation of untrusted event payloads), ``runtime`` (the handler
shape), ``heartbeat`` (a background loop that always stops), ``checkpoints`` (which
complete checkpoints a bucket holds). GCP-specific: ``gcp`` (the Pub/Sub message, Cloud
Storage, conditional JSON objects, Cloud Monitoring) and ``push`` (a Pub/Sub push
request into a handler). AWS-specific:
``eventbridge`` (the EventBridge envelope) and ``aws`` (boto3 clients with standard
retries, conditional JSON objects in S3, metrics).
"""
