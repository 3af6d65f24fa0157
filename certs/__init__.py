"""The webhook's CA and serving certificates, rotation, Secret and caBundle."""
