output "bucket" {
  description = "Name of the project bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the project bucket."
  value       = aws_s3_bucket.this.arn
}

output "kms_key_arn" {
  description = "ARN of the project KMS key."
  value       = aws_kms_key.this.arn
}
