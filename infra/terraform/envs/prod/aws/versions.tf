# Root 1 of 2: everything AWS (bucket, network, EKS and its node groups and add-on, IAM, MLflow's
# database). Only the aws provider: apply it from anywhere with AWS credentials. The Kubernetes
# layer (../k8s) reads this root's outputs from its remote state and needs the cluster API.
terraform {
  required_version = ">= 1.11.0" # write-only attributes and ephemeral resources (the DB password)
  required_providers {
    aws = { source = "hashicorp/aws", version = "~> 5.100" }
  }
  # Remote state: `terraform init -backend-config=...` (see infra/README.md).
  backend "s3" {}
}

provider "aws" {
  region = var.region
  default_tags {
    tags = local.tags
  }
}
